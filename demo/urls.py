"""Routes of the demo destinations (mounted under ``/demo/``): the payment provider under
``pay/``, the second payment provider under ``pay2/``."""

from django.urls import path

from . import provider

app_name = "demo"

urlpatterns = [
    path("pay/charge/", provider.charge, name="pay-charge"),
    path("pay/transfer/", provider.transfer, name="pay-transfer"),
    path("pay/lookup/", provider.lookup, name="pay-lookup"),
    path("pay2/charge/", provider.second_charge, name="pay2-charge"),
]
