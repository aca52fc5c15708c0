"""Dashboard routes."""

from django.urls import path

from . import views

app_name = "admin_ui"
urlpatterns = [path("", views.overview, name="overview")]
