"""App config for the operator dashboard."""

from django.apps import AppConfig


class AdminUiConfig(AppConfig):
    """Operator dashboard."""

    name = "admin_ui"
    verbose_name = "Tenure operator dashboard"
