"""App config for the demo jobs."""

from django.apps import AppConfig


class DemoConfig(AppConfig):
    """Demo jobs and destinations."""

    name = "demo"
    verbose_name = "Tenure demo"
