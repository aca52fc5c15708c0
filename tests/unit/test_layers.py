"""The layers contract: every import statement of the product (``scheduler_core``, ``admin_ui``),
those inside functions and under ``TYPE_CHECKING`` included, points down the layers, and no
module imports in a circle; vendor branches live only in the storage drivers; Celery and RQ are
imported only by the transports (their adapters and checks); the verifier is not part of the product.

An import ``from PKG import name`` counts as an import of the package ``PKG`` too (it runs
``PKG/__init__.py``), so a module below the package's root that wrote ``from scheduler_core
import conf`` would close a circle through the root, which re-exports the public API.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("scheduler_core", "admin_ui")

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "domain",
        (
            "scheduler_core.domain",
            "scheduler_core.exceptions",
            "scheduler_core.conf",
            "scheduler_core.hooks",
            "scheduler_core.db",
            "scheduler_core.destinations",
            "scheduler_core.logging",
            "scheduler_core.signals",
            "scheduler_core.tracing",
        ),
    ),
    ("models", ("scheduler_core.models",)),
    ("storage", ("scheduler_core.storage",)),
    ("api", ("scheduler_core.api",)),
    ("read", ("scheduler_core.read",)),
    ("runtime", ("scheduler_core.runtime",)),
    ("services", ("scheduler_core.services",)),
    (
        "edges",
        (
            "scheduler_core.transports",
            "scheduler_core.management",
            "scheduler_core.apps",
            "scheduler_core.checks",
            "scheduler_core.admin",
            "scheduler_core.views",
            "scheduler_core.urls",
            "scheduler_core.backends",
            "admin_ui",
            "scheduler_core",
        ),
    ),
)
"""Bottom to top; a module may import its own layer and those below it, never one above."""


def module_name(path: Path, root: Path) -> str:
    name = path.relative_to(root).with_suffix("").as_posix().replace("/", ".")
    return name.removesuffix(".__init__")


def modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of ``packages`` under ``root`` (migrations left out), by dotted name."""
    found = {}
    for pkg in packages:
        for path in (root / pkg).rglob("*.py"):
            if "migrations" not in path.parts:
                found[module_name(path, root)] = path
    return found


def imports(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The known modules ``name`` imports, anywhere in its file."""
    known = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                up = parts[: len(parts) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in names:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
    return targets


def graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    mods = modules(root, packages)
    return {name: imports(name, path, mods) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def layer_of(name: str) -> int:
    """The index of ``name``'s layer (the longest matching prefix decides)."""
    best, best_len = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    assert best >= 0, f"{name} is in no layer: add it to LAYERS"
    return best


def upward(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{src} ({LAYERS[layer_of(src)][0]}) imports {dst} ({LAYERS[layer_of(dst)][0]})"
        for src, targets in edges.items()
        for dst in targets
        if layer_of(dst) > layer_of(src)
    )


def test_no_module_imports_in_a_circle() -> None:
    assert cycles(graph(ROOT, PRODUCT)) == []


def test_every_import_points_down_the_layers() -> None:
    assert upward(graph(ROOT, PRODUCT)) == []


def test_the_contract_sees_a_circle_through_a_package_and_an_import_inside_a_function(
    tmp_path: Path,
) -> None:
    pkg = tmp_path / "scheduler_core"
    (pkg / "storage").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .storage.base import thing\n")
    (pkg / "storage" / "__init__.py").write_text("")
    (pkg / "storage" / "base.py").write_text(
        "def thing():\n    from .. import conf\n    from ..api import registry\n"
    )
    (pkg / "conf.py").write_text("")
    (pkg / "api").mkdir()
    (pkg / "api" / "__init__.py").write_text("")
    (pkg / "api" / "registry.py").write_text("")
    edges = graph(tmp_path, ["scheduler_core"])
    assert cycles(edges) == [["scheduler_core", "scheduler_core.storage.base"]]
    assert upward(edges) == [
        "scheduler_core.storage.base (storage) imports scheduler_core (edges)",
        "scheduler_core.storage.base (storage) imports scheduler_core.api (api)",
        "scheduler_core.storage.base (storage) imports scheduler_core.api.registry (api)",
    ]


def _sources(*folders: str) -> dict[str, str]:
    return {
        path.relative_to(ROOT).as_posix(): path.read_text()
        for folder in folders
        for path in (ROOT / folder).rglob("*.py")
        if "migrations" not in path.parts
    }


def test_vendor_branches_live_only_in_the_storage_drivers() -> None:
    offenders = [
        rel
        for rel, text in _sources(*PRODUCT).items()
        if not rel.startswith("scheduler_core/storage/")
        and any(f"vendor {op}" in text for op in ("==", "!="))
    ]
    assert offenders == []


def test_celery_and_rq_are_imported_only_by_the_transports() -> None:
    offenders = []
    for rel, text in _sources(*PRODUCT).items():
        for node in ast.walk(ast.parse(text)):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            third_party = any(n.split(".")[0] in ("celery", "rq", "django_rq") for n in names)
            if third_party and not rel.startswith("scheduler_core/transports/"):
                offenders.append(rel)
    assert offenders == []


def test_the_product_carries_no_test_switch_and_imports_no_verifier() -> None:
    for rel, text in _sources(*PRODUCT).items():
        assert "TEST_DISABLE" not in text, rel
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level:
                assert not (node.module or "").startswith(("verifier", "demo", "bench")), rel
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith(("verifier", "demo", "bench")) for a in node.names)


def test_every_product_module_says_what_it_owns() -> None:
    missing = [
        rel
        for rel, text in _sources(*PRODUCT).items()
        if text.strip() and ast.get_docstring(ast.parse(text)) is None
    ]
    assert missing == []
