"""Routes of the demo destinations (mounted under ``/demo/``)."""

from django.urls import path

from . import provider

app_name = "demo"

urlpatterns = [
    path("pay/charge/", provider.charge, name="pay-charge"),
    path("pay/transfer/", provider.transfer, name="pay-transfer"),
    path("pay/lookup/", provider.lookup, name="pay-lookup"),
]
