"""Dashboard routes. Action URLs accept POST only; their confirmation steps are GETs that
never write. ``metrics`` is the Prometheus exposition, behind its own guard (a bearer token
or the view permission; :mod:`scheduler_core.views`). ``login`` and ``logout`` are the
dashboard's own (:mod:`admin_ui.accounts`), for a project without a login of its own."""

from django.urls import path

import scheduler_core.views

from . import accounts, history, queue_views, schedule_views, views, workflow_views

app_name = "admin_ui"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("login/", accounts.login, name="login"),
    path("logout/", accounts.logout, name="logout"),
    path("history/", history.history_view, name="history"),
    path("jobs/", views.job_list, name="job_list"),
    path("jobs/<int:job_id>/", views.job_detail, name="job_detail"),
    path("jobs/<int:job_id>/<slug:key>/confirm/", views.action_confirm, name="action_confirm"),
    path("jobs/<int:job_id>/<slug:key>/", views.job_action, name="job_action"),
    path("bulk/<slug:action>/confirm/", views.bulk_confirm, name="bulk_confirm"),
    path("bulk/<slug:action>/", views.bulk_action, name="bulk_action"),
    path("schedules/", schedule_views.schedule_list, name="schedule_list"),
    path("schedules/<int:schedule_id>/", schedule_views.schedule_detail, name="schedule_detail"),
    path(
        "schedules/<int:schedule_id>/<slug:key>/confirm/",
        schedule_views.schedule_confirm,
        name="schedule_confirm",
    ),
    path(
        "schedules/<int:schedule_id>/<slug:key>/",
        schedule_views.schedule_action,
        name="schedule_action",
    ),
    path("metrics", scheduler_core.views.metrics_view, name="metrics"),
    path("queues/", queue_views.queue_list, name="queues"),
    path("workflows/", workflow_views.workflow_list, name="workflow_list"),
    path("workflows/<int:workflow_id>/", workflow_views.workflow_detail, name="workflow_detail"),
    path(
        "workflows/<int:workflow_id>/<slug:action>/",
        workflow_views.workflow_action,
        name="workflow_action",
    ),
    path(
        "queues/<str:queue>/<slug:key>/confirm/",
        queue_views.queue_confirm,
        name="queue_confirm",
    ),
    path("queues/<str:queue>/<slug:key>/", queue_views.queue_action, name="queue_action"),
]
