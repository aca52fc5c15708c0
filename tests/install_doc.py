"""docs/install.md's code blocks, taken as written and run in a new project, so the page cannot
drift from what works (``.ci/host_project.sh`` calls this; ``tests/unit/test_install_doc.py``
checks that every block carries a marker).

A marker is an HTML comment on the line before a fenced block, invisible on the rendered page::

    <!-- install-test GROUP: ACTION [ARGUMENT] [if django<6 | if django>=6] -->
    <!-- install-test skip: why this block is not run -->

ACTION is ``sh`` (each line run by bash in the project's directory, the virtualenv's ``bin``
first on ``PATH``), ``write FILE`` or ``append FILE`` (the block's text into a file of the
project), ``shell`` (the block run by ``python manage.py shell -c``) or ``daemons`` (each line
started as a long-running process; once every job is finished they get SIGTERM and must exit
cleanly). Blocks run in the page's order, one GROUP per call.

What a script cannot do as a person does is changed here, and only here (``SUBSTITUTIONS``;
each must find its text, or the run fails): the checkout's path for ``path/to/tenure``,
``--noinput`` for ``createsuperuser`` (the account comes from ``DJANGO_SUPERUSER_*``), and
after each settings block the run's own lines (``--settings-extra``: its database and an
e-mail backend that writes files).

    python tests/install_doc.py --group quickstart --project DIR --venv VENV --checkout ROOT \
        --settings-extra FILE
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "install.md"

MARKER = re.compile(
    r"^<!-- install-test (?P<group>[\w-]+): (?P<rest>.*?) -->$",
)
FENCE = re.compile(r"^```(?P<lang>\w*)$")
ACTIONS = ("sh", "write", "append", "shell", "daemons")


@dataclass(frozen=True, kw_only=True)
class Block:
    """One fenced block of the page and what its marker says to do with it."""

    line: int
    lang: str
    code: str
    group: str | None = None
    action: str | None = None
    argument: str = ""
    condition: str = ""
    skip_reason: str = ""


def blocks(text: str) -> list[Block]:
    """Every fenced block of ``text``, with the marker on the line before it (if any)."""
    found: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start = i
        end = next(j for j in range(i + 1, len(lines)) if lines[j] == "```")
        code = "\n".join(lines[start + 1 : end]) + "\n"
        marker = MARKER.match(lines[start - 1]) if start > 0 else None
        fields: dict[str, str] = {}
        if marker and marker["group"] == "skip":
            fields = {"skip_reason": marker["rest"]}
        elif marker:
            rest, _, condition = marker["rest"].partition(" if ")
            action, _, argument = rest.partition(" ")
            if action not in ACTIONS:
                raise ValueError(f"install.md line {start}: unknown action {action!r}")
            fields = {
                "group": marker["group"],
                "action": action,
                "argument": argument.strip(),
                "condition": condition.strip(),
            }
        found.append(Block(line=start + 1, lang=fence["lang"], code=code, **fields))
        i = end + 1
    return found


# (what the page says, what the run does instead): each must occur in the group's blocks.
SUBSTITUTIONS = {
    "quickstart": [
        ("path/to/tenure", "{checkout}"),
        ("manage.py createsuperuser", "manage.py createsuperuser --noinput"),
    ],
    "tasks": [],
}


class Runner:
    """Runs one group of the page's blocks in ``project`` with ``venv``'s Python."""

    def __init__(self, *, project: Path, venv: Path, checkout: Path, settings_extra: str) -> None:
        self.project = project
        self.checkout = checkout
        self.settings_extra = settings_extra
        self.env = {
            **os.environ,
            "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "VIRTUAL_ENV": str(venv),
            "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("DJANGO_SETTINGS_MODULE", None)
        self.python = str(venv / "bin" / "python")

    def run(self, group: str) -> None:
        chosen = [b for b in blocks(DOC.read_text()) if b.group == group]
        if not chosen:
            sys.exit(f"install.md has no block in group {group!r}")
        unused = [
            said for said, _ in SUBSTITUTIONS[group] if not any(said in b.code for b in chosen)
        ]
        if unused:
            sys.exit(f"install.md no longer says {unused}: update SUBSTITUTIONS")
        for block in chosen:
            if block.condition and not self._holds(block.condition):
                print(f"\n-- install.md line {block.line}: skipped ({block.condition} is false)")
                continue
            print(f"\n-- install.md line {block.line}: {block.action} {block.argument}".rstrip())
            code = block.code
            for said, done in SUBSTITUTIONS[group]:
                code = code.replace(said, done.format(checkout=self.checkout))
            getattr(self, f"_{block.action}")(code, block.argument)

    def _holds(self, condition: str) -> bool:
        match = re.fullmatch(r"django(<|>=)(\d+)", condition)
        if not match:
            raise ValueError(f"unknown condition {condition!r}")
        major = int(self._output([self.python, "-c", "import django; print(django.VERSION[0])"]))
        return major < int(match[2]) if match[1] == "<" else major >= int(match[2])

    def _output(self, args: list[str]) -> str:
        return subprocess.run(
            args, cwd=self.project, env=self.env, check=True, capture_output=True, text=True
        ).stdout.strip()

    def _sh(self, code: str, _: str) -> None:
        subprocess.run(
            ["bash", "-euo", "pipefail", "-c", code],
            cwd=self.project,
            env=self.env,
            check=True,
            stdin=subprocess.DEVNULL,
        )

    def _write(self, code: str, name: str) -> None:
        path = self.project / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)

    def _append(self, code: str, name: str) -> None:
        path = self.project / name
        extra = self.settings_extra if name.endswith("settings.py") else ""
        path.write_text(f"{path.read_text()}\n{code}{extra}")

    def _shell(self, code: str, _: str) -> None:
        subprocess.run(
            [self.python, "manage.py", "shell", "-v", "0", "-c", code],
            cwd=self.project,
            env=self.env,
            check=True,
            stdin=subprocess.DEVNULL,
        )

    def _daemons(self, code: str, _: str) -> None:
        commands = [line.split("#")[0].strip() for line in code.splitlines()]
        procs = [
            subprocess.Popen(
                ["bash", "-c", f"exec {command}"],
                cwd=self.project,
                env=self.env,
                stdin=subprocess.DEVNULL,
            )
            for command in commands
            if command
        ]
        try:
            self._until_every_job_finished(procs)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            codes = [proc.wait(timeout=60) for proc in procs]
        if any(codes):
            sys.exit(f"after SIGTERM the processes exited {codes}, not 0")

    def _until_every_job_finished(self, procs: list[subprocess.Popen[bytes]]) -> None:
        ask = (
            "from scheduler_core.models import Job; "
            "print(Job.objects.exclude(state__in=['succeeded', 'failed', 'cancelled']).count(),"
            " Job.objects.count())"
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(proc.poll() is not None for proc in procs):
                sys.exit(f"a process ended by itself: {[p.returncode for p in procs]}")
            open_jobs, jobs = map(
                int, self._output([self.python, "manage.py", "shell", "-v", "0", "-c", ask]).split()
            )
            if jobs and not open_jobs:
                return
            time.sleep(1)
        sys.exit("the jobs did not finish within 120 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", required=True)
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--venv", type=Path, required=True)
    parser.add_argument("--checkout", type=Path, required=True)
    parser.add_argument("--settings-extra", type=Path, required=True)
    args = parser.parse_args()
    args.project.mkdir(parents=True, exist_ok=True)
    Runner(
        project=args.project,
        venv=args.venv,
        checkout=args.checkout,
        settings_extra=args.settings_extra.read_text(),
    ).run(args.group)


if __name__ == "__main__":
    main()
