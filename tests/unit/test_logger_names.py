"""Every logger the package names is documented: docs/reference/logging.md lists them, and a
logger added to the code without a row there fails this test."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"""getLogger\(\s*["']([^"']+)["']\s*\)""")


def _named_in(*packages: str) -> set[str]:
    return {
        name
        for pkg in packages
        for path in (ROOT / pkg).rglob("*.py")
        for name in NAMED.findall(path.read_text())
    }


def test_every_logger_of_the_package_is_in_the_reference() -> None:
    page = (ROOT / "docs" / "reference" / "logging.md").read_text()
    documented = set(re.findall(r"^\| `((?:tenure|django)\.[a-z_.]+)` \|", page, flags=re.M))
    named = _named_in("scheduler_core", "admin_ui")
    assert "tenure.executor" in named
    assert named - documented == set()
    assert documented - named == {"django.dispatch"}
