"""The docs site's strict build (mkdocs.yml, docs/_site/hooks.py) refuses a page that links to a
missing file or anchor, and resolves a link the way the repository does: a small site that
inherits the real configuration is built with a broken link, a broken anchor, and without."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _build(site: Path, index: str) -> subprocess.CompletedProcess[str]:
    """Build a site of two pages and a README, inheriting mkdocs.yml but for its navigation
    and the generated reference (not needed here)."""
    (site / "docs").mkdir(parents=True, exist_ok=True)
    (site / "docs" / "index.md").write_text(index)
    (site / "docs" / "other.md").write_text("# Other\n\n## A section\n\nText.\n")
    (site / "README.md").write_text("# Readme\n\n[the other page](docs/other.md#a-section)\n")
    (site / "mkdocs.yml").write_text(
        f"INHERIT: {ROOT / 'mkdocs.yml'}\n"
        "docs_dir: docs\n"
        "site_dir: out\n"
        f"hooks: ['{ROOT / 'docs/_site/hooks.py'}']\n"
        "plugins: [search]\n"
        "nav: [{Home: docs/index.md}, {Other: docs/other.md}]\n"
    )
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(site / "mkdocs.yml")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_links_to_existing_pages_anchors_and_repository_files_build(tmp_path: Path) -> None:
    done = _build(
        tmp_path,
        "# Home\n\n[a section](other.md#a-section), [the README](../README.md)\n",
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "other.html").exists()
    assert 'href="other.html#a-section"' in (tmp_path / "out" / "README.html").read_text()


def test_a_link_to_a_missing_page_fails_the_build(tmp_path: Path) -> None:
    done = _build(tmp_path, "# Home\n\n[gone](gone.md)\n")
    assert done.returncode != 0
    assert "'gone.md'" in done.stderr and "not found" in done.stderr, done.stderr


def test_a_link_to_a_missing_anchor_fails_the_build(tmp_path: Path) -> None:
    done = _build(tmp_path, "# Home\n\n[no such section](other.md#no-such-section)\n")
    assert done.returncode != 0
    assert "does not contain an anchor '#no-such-section'" in done.stderr, done.stderr
