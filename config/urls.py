"""URL routes: the operator dashboard at /ops/, Django's admin (read-only), login."""

from django.contrib import admin
from django.urls import include, path

import scheduler_core.views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("ops/", include("admin_ui.urls")),
    path("metrics", scheduler_core.views.metrics_view, name="metrics"),
    path("demo/", include("demo.urls")),
]
