"""On whichever Django this suite runs (5.2 or 6.x), Tenure raises no deprecation warning:
every module imported, the example project set up and checked, every dashboard template
compiled, in a fresh interpreter where any ``DeprecationWarning`` or
``PendingDeprecationWarning`` is an error. (The suite's own run turns those warnings into
errors too when they point at Tenure's modules: ``filterwarnings`` in pyproject.toml.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import importlib, pkgutil, warnings
warnings.simplefilter("error", DeprecationWarning)
warnings.simplefilter("error", PendingDeprecationWarning)
import django
django.setup()
from django.core.management import call_command
from django.template.loader import get_template
from pathlib import Path

imported = 0
for package in ("scheduler_core", "admin_ui", "config", "demo", "verifier"):
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        importlib.import_module(info.name)
        imported += 1
templates = sorted(Path("admin_ui/templates").rglob("*.html"))
for path in templates:
    get_template(str(path.relative_to("admin_ui/templates")))
call_command("check", "--fail-level", "WARNING")
print(f"django {django.__version__}: {imported} modules, {len(templates)} templates, no warning")
"""


def test_nothing_of_tenure_warns_of_a_deprecation_on_this_django() -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "TENURE_TRANSPORT": "polling",
        "PYTHONWARNINGS": "error::DeprecationWarning,error::PendingDeprecationWarning",
    }
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no warning" in done.stdout, done.stdout
