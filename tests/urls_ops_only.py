"""A host project's URLs with nothing but the dashboard: ``path("ops/", include("admin_ui.urls"))``."""

from django.urls import include, path

urlpatterns = [path("ops/", include("admin_ui.urls"))]
