"""The console reads through the library: ``admin_ui`` holds views, forms and templates, and
every read it needs is a named operation of :mod:`scheduler_core.read`. No ORM query and no
storage import in ``admin_ui`` beyond fetching one object by id (and the auth rows its
permission set-up and demo users need), so a state's meaning is decided once."""

from __future__ import annotations

import re
from pathlib import Path

ADMIN_UI = Path(__file__).resolve().parents[2] / "admin_ui"

ORM_USE = re.compile(
    r"\.objects\b|\.filter\(|\.exclude\(|\.annotate\(|\.aggregate\(|\.values_list\(|\.values\([^)]|"
    r"\.select_related\(|\.order_by\(|\.using\(|"
    r"from django\.db\.models import|from django\.db import models|"
    r"scheduler_core\.storage|from scheduler_core import storage|driver\(\)"
)
"""An ORM query, a query construct, or a way around the read side to the store."""

ALLOWED: dict[str, set[str]] = {
    # Fetching one object by id.
    "views.py": {'job = get_object_or_404(Job.objects.select_related("spec"), pk=job_id)'},
    # The operate permission and the demo users: auth rows, not the scheduler's.
    "permissions.py": {
        "ct, _ = content_type_model.objects.db_manager(using).get_or_create(",
        "perm, _ = permission_model.objects.db_manager(using).get_or_create(",
        'perms = [Permission.objects.get(content_type__app_label="scheduler_core", codename="view_job")]',
    },
    "management/commands/create_demo_users.py": {
        "user, _ = model.objects.get_or_create(username=username)"
    },
    "apps.py": {"from django.db.models.signals import post_migrate"},
}
"""Per file (relative to ``admin_ui``), the lines that may match :data:`ORM_USE`."""


def orm_uses() -> list[str]:
    found = []
    for path in sorted(ADMIN_UI.rglob("*.py")):
        rel = path.relative_to(ADMIN_UI).as_posix()
        if rel.startswith("migrations/"):
            continue
        allowed = ALLOWED.get(rel, set())
        for n, line in enumerate(path.read_text().splitlines(), 1):
            text = line.strip()
            if ORM_USE.search(text) and text not in allowed:
                found.append(f"admin_ui/{rel}:{n}: {text}")
    return found


def test_admin_ui_reads_only_through_the_read_side() -> None:
    assert orm_uses() == []


def test_the_check_finds_an_orm_query() -> None:
    assert ORM_USE.search('Job.objects.filter(state="waiting")')
    assert ORM_USE.search("from scheduler_core.storage.drivers import driver")
    assert ORM_USE.search("rows = qs.values_list('name', flat=True)")
    assert not ORM_USE.search("from scheduler_core.read import jobs")
