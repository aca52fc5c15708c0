"""URL routes: the operator dashboard at /ops/, Django's admin (read-only), login."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("ops/", include("admin_ui.urls")),
]
