"""docs/install.md is run, not only read: every code block carries a marker that says how
``tests/install_doc.py`` (called by ``.ci/host_project.sh`` on both stacks) runs it, or why it
is not run, and the quick start covers each step the page promises."""

from __future__ import annotations

import pytest

from tests.install_doc import DOC, SUBSTITUTIONS, blocks


def test_every_code_block_of_the_install_page_is_run_or_says_why_not() -> None:
    found = blocks(DOC.read_text())
    unmarked = [b.line for b in found if b.action is None and not b.skip_reason]
    assert found and not unmarked, f"docs/install.md blocks without a marker at lines {unmarked}"


def test_the_quick_start_covers_install_apps_urls_jobs_migrate_and_an_executor() -> None:
    quick = [b for b in blocks(DOC.read_text()) if b.group == "quickstart"]
    steps = {
        "install from the built wheel": ("sh", "pip install"),
        "a project and an app": ("sh", "startapp shop"),
        "INSTALLED_APPS": ("append", '"admin_ui"'),
        "the dashboard's URLs": ("write", 'include("admin_ui.urls")'),
        "the app's jobs.py": ("write", "@job("),
        "migrate": ("sh", "manage.py migrate"),
        "an enqueue": ("shell", ".enqueue("),
        "an executor": ("daemons", "manage.py run_executor"),
    }
    missing = [
        step
        for step, (action, text) in steps.items()
        if not any(b.action == action and text in b.code for b in quick)
    ]
    assert not missing, missing
    [urls] = [b for b in quick if b.argument == "mysite/urls.py"]
    [login] = [b for b in quick if "LOGIN_URL" in b.code]
    assert '"admin_ui:login"' in login.code and "path(" in urls.code
    for said, _ in SUBSTITUTIONS["quickstart"]:
        assert any(said in b.code for b in quick), said


def test_markers_are_read_with_their_action_argument_and_condition() -> None:
    text = "\n".join(
        [
            "<!-- install-test g: append mysite/settings.py -->",
            "```python",
            "X = 1",
            "```",
            "<!-- install-test g: sh if django<6 -->",
            "```sh",
            "echo 5.2",
            "```",
            "<!-- install-test skip: needs a broker -->",
            "```sh",
            "celery worker",
            "```",
            "```python",
            "unmarked = True",
            "```",
        ]
    )
    a, b, c, d = blocks(text)
    assert (a.group, a.action, a.argument, a.code) == (
        "g",
        "append",
        "mysite/settings.py",
        "X = 1\n",
    )
    assert (b.action, b.condition, b.lang) == ("sh", "django<6", "sh")
    assert c.action is None and c.skip_reason == "needs a broker"
    assert d.action is None and not d.skip_reason and d.line == 13
    with pytest.raises(ValueError, match="unknown action 'run'"):
        blocks("<!-- install-test g: run -->\n```sh\nx\n```\n")
