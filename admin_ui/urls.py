"""Dashboard routes. Action URLs accept POST only; their confirmation steps are GETs that
never write. ``metrics`` is the Prometheus exposition, behind its own guard (a bearer token
or the view permission; :mod:`scheduler_core.views`)."""

from django.urls import path

import scheduler_core.views

from . import history, views

app_name = "admin_ui"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("history/", history.history_view, name="history"),
    path("jobs/", views.job_list, name="job_list"),
    path("jobs/<int:job_id>/", views.job_detail, name="job_detail"),
    path("jobs/<int:job_id>/<slug:key>/confirm/", views.action_confirm, name="action_confirm"),
    path("jobs/<int:job_id>/<slug:key>/", views.job_action, name="job_action"),
    path("bulk/<slug:action>/confirm/", views.bulk_confirm, name="bulk_confirm"),
    path("bulk/<slug:action>/", views.bulk_action, name="bulk_action"),
    path("metrics", scheduler_core.views.metrics_view, name="metrics"),
]
