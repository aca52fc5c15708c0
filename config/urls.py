"""URL routes: the operator dashboard at /ops/ (its metrics at /ops/metrics), the same
metrics at /metrics, Django's admin (read-only), login."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("ops/", include("admin_ui.urls")),
    path("", include("scheduler_core.urls")),
    path("demo/", include("demo.urls")),
]
