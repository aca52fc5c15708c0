"""The docs site's build hooks (named in mkdocs.yml): where each page lands, and the reference
pages generated from the code.

A page keeps the links it has in the repository: docs/guarantees.md links
``../bench/README.md``, README.md links ``docs/install.md``. So that one link is right both on
the repository host and in the site, every file is given its repository path as its source
(``docs/guarantees.md``, ``bench/README.md``) and lands where the site shows it (the docs at
the site's root, the rest at their own path); MkDocs then resolves and checks each link and
anchor against those paths, and the strict build fails on one whose target is missing.

The reference pages hold a marker where the code's own text goes: ``<!-- generated: settings
-->`` (every ``TENURE_<NAME>``, its type, default and docstring, read from
``scheduler_core/conf.py``) and ``<!-- generated: commands -->`` (each management command of
the two apps a host installs, with the help its parser prints).
"""

from __future__ import annotations

import ast
import inspect
import io
import os
import re
import sys
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files, InclusionLevel
from mkdocs.structure.pages import Page

DOCS = "docs/"
# Files outside docs/ that pages link to: the README, and the benchmarks' method, history and
# reports (whose plots the reports show).
OUTSIDE = ("README.md", "bench/README.md", "bench/results/*.md", "bench/results/*.png")
APPS_WITH_COMMANDS = ("scheduler_core", "admin_ui")
MARKER = re.compile(r"<!-- generated: (\w+) -->")
# Sphinx roles in docstrings (``:mod:`x```, ``:class:`~x.Y```) read as code in the site.
ROLE = re.compile(r":(?:mod|func|class|attr|meth|data|exc):<code>~?([^<]*)</code>")


def site_path(repo_path: str) -> str:
    """Where a repository file lands in the site: docs/ at the root, anything else at its
    own path; a Markdown page becomes its ``.html``."""
    path = repo_path.removeprefix(DOCS)
    if path.endswith(".md"):
        path = path[: -len(".md")] + ".html"
    return path


def _root(config: MkDocsConfig) -> Path:
    """The repository: the folder of mkdocs.yml."""
    return Path(config.config_file_path).resolve().parent


def _file(repo_path: str, config: MkDocsConfig) -> File:
    return File(
        repo_path,
        src_dir=str(_root(config)),
        dest_dir=config.site_dir,
        use_directory_urls=config.use_directory_urls,
        dest_uri=site_path(repo_path),
    )


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Give every page its repository path as source, and add the files outside docs/."""
    root = _root(config)
    docs_dir = Path(config.docs_dir).resolve()
    laid = []
    for f in files:
        src = Path(f.abs_src_path).resolve() if f.abs_src_path else None
        if src is None or not src.is_relative_to(docs_dir):
            laid.append(f)  # the theme's own assets
        elif f.inclusion is not InclusionLevel.EXCLUDED:
            laid.append(_file(DOCS + f.src_uri, config))
    for pattern in OUTSIDE:
        laid.extend(
            _file(p.relative_to(root).as_posix(), config) for p in sorted(root.glob(pattern))
        )
    return Files(laid)


def on_page_markdown(markdown: str, *, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Fill a page's generation markers."""
    return MARKER.sub(lambda m: GENERATORS[m.group(1)](_root(config)), markdown)


def on_page_content(html: str, *, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Show the docstrings' Sphinx roles as plain code."""
    return ROLE.sub(r"<code>\1</code>", html)


def _plain(docstring: str) -> str:
    """A docstring as Markdown: Sphinx roles and double backticks as code."""
    paragraphs = inspect.cleandoc(docstring).split("\n\n")
    text = "\n\n".join(" ".join(p.split()) for p in paragraphs)
    text = re.sub(r":(?:mod|func|class|attr|meth|data|exc):`~?([^`]*)`", r"`\1`", text)
    return text.replace("``", "`")


def settings_reference(root: Path) -> str:
    """Every field of ``TenureSettings`` as ``TENURE_<NAME>``, a heading of its own (so a page
    can link ``settings.md#tenure_poll_interval``), with its type, default and docstring, read
    from the source (nothing is imported)."""
    source = (root / "scheduler_core/conf.py").read_text()
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TenureSettings")
    out = []
    body = cls.body
    for i, node in enumerate(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        after = body[i + 1] if i + 1 < len(body) else None
        doc = "No description yet."
        if (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            doc = _plain(after.value.value)
        kind = ast.get_source_segment(source, node.annotation) or ""
        default = ast.get_source_segment(source, node.value) if node.value else ""
        out.append(f"### `TENURE_{node.target.id}`\n\n`{kind}`, default `{default}`.\n\n{doc}\n")
    return "\n".join(out)


def _django(root: Path) -> None:
    """Start Django with the example project's settings, loading no broker client."""
    import django

    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("TENURE_TRANSPORT", "polling")
    django.setup()


def commands_reference(root: Path) -> str:
    """Each management command of the apps a host installs: its help and its options, as
    ``manage.py <command> --help`` prints them."""
    _django(root)
    from django.core.management import find_commands, load_command_class

    os.environ["COLUMNS"] = "100"  # argparse's width, so the page does not follow the terminal
    out = []
    for app in APPS_WITH_COMMANDS:
        folder = root / app / "management"
        for name in sorted(find_commands(str(folder))):
            command: Any = load_command_class(app, name)
            parser = command.create_parser("manage.py", name)
            buf = io.StringIO()
            with redirect_stdout(buf):
                parser.print_help()
            out.append(f"### {name}\n\nFrom `{app}`.\n\n```text\n{buf.getvalue().rstrip()}\n```\n")
    return "\n".join(out)


GENERATORS: dict[str, Callable[[Path], str]] = {
    "settings": settings_reference,
    "commands": commands_reference,
}
