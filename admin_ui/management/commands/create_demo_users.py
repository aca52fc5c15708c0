"""``manage.py create_demo_users``: an operator and a view-only account, credentials printed."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from admin_ui.permissions import grant


class Command(BaseCommand):
    help = (
        "Create (or reset) an operator account that may act on jobs and a viewer account that "
        "may only look, and print their credentials."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--operator", default="operator", help="operator username")
        parser.add_argument("--viewer", default="viewer", help="viewer username")
        parser.add_argument(
            "--password",
            default=None,
            help="password for both accounts (default: a new random one for each)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        for username, operate in ((opts["operator"], True), (opts["viewer"], False)):
            password = opts["password"] or secrets.token_urlsafe(12)
            user = create_user(username, password, operate=operate)
            role = "operator (view + operate)" if operate else "viewer (view only)"
            self.stdout.write(f"{role:<26} username={user.get_username()} password={password}")


def create_user(username: str, password: str, *, operate: bool) -> Any:
    """Create or reset ``username`` with ``password`` and exactly the dashboard permissions."""
    model = get_user_model()
    user, _ = model.objects.get_or_create(username=username)
    user.set_password(password)
    user.is_active = True
    user.save()
    user.user_permissions.clear()
    grant(user, operate=operate)
    return user
