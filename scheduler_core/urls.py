"""The core app's routes: ``path("", include("scheduler_core.urls"))`` serves ``/metrics``
(guarded; see :mod:`scheduler_core.views`). ``admin_ui.urls`` mounts the same view."""

from django.urls import path

from . import views

urlpatterns = [path("metrics", views.metrics_view, name="tenure-metrics")]
