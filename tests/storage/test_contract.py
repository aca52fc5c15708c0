"""The storage contract (``scheduler_core/storage/contract.py``) holds every driver: each member
of :class:`StorageDriver` is present on ``PostgresDriver`` and ``SqliteDriver``, and each
operation's parameters have the protocol's names, kinds and order. No database is touched:
the classes are compared as written (``scheduler_core/storage/drivers.py`` has the type checker
compare them too)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from scheduler_core.storage.contract import StorageDriver
from scheduler_core.storage.postgres import PostgresDriver
from scheduler_core.storage.sqlite import SqliteDriver

DRIVERS = [PostgresDriver, SqliteDriver]


def members(protocol: type) -> set[str]:
    """The names the protocol states: its operations and its attributes."""
    declared = {k for k in vars(protocol) if not k.startswith("_")}
    return declared | {k for k in getattr(protocol, "__annotations__", {}) if not k.startswith("_")}


def has(cls: type, name: str) -> bool:
    """Whether ``cls`` offers ``name``: defined on the class, or an instance attribute its
    classes declare (``alias``, set by ``__init__``)."""
    return hasattr(cls, name) or any(
        name in vars(c).get("__annotations__", {}) for c in cls.__mro__
    )


def missing(cls: type, protocol: type = StorageDriver) -> list[str]:
    return sorted(k for k in members(protocol) if not has(cls, k))


def parameters(fn: Any) -> list[tuple[str, Any]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


def mismatched(cls: type, protocol: type = StorageDriver) -> list[str]:
    """The operations whose parameters differ from the protocol's (name, kind or order)."""
    found = []
    for name in sorted(members(protocol)):
        stated = inspect.getattr_static(protocol, name, None)
        if stated is None or isinstance(stated, property) or not hasattr(cls, name):
            continue
        if isinstance(inspect.getattr_static(cls, name), property):
            found.append(f"{name}: a property, not an operation")
            continue
        want, got = parameters(getattr(protocol, name)), parameters(getattr(cls, name))
        if want != got:
            found.append(f"{name}: {got} (the contract says {want})")
    return found


def test_the_contract_states_the_operations_the_layers_above_use() -> None:
    stated = members(StorageDriver)
    assert {"claim", "complete_many_and_claim", "finish", "heartbeat", "effect_intend"} <= stated
    assert {"alias", "vendor", "connection", "read_identity", "compact_table"} <= stated
    assert len(stated) > 90


@pytest.mark.parametrize("cls", DRIVERS, ids=lambda c: c.__name__)
def test_every_driver_has_every_member_of_the_contract(cls: type) -> None:
    assert missing(cls) == []


@pytest.mark.parametrize("cls", DRIVERS, ids=lambda c: c.__name__)
def test_every_driver_names_each_operation_s_parameters_as_the_contract_does(cls: type) -> None:
    assert mismatched(cls) == []


def test_the_comparison_sees_a_missing_member_and_a_renamed_parameter() -> None:
    class Partial(SqliteDriver):
        def heartbeat(self, the_lease: Any) -> bool:  # type: ignore[override]
            return True

    assert mismatched(Partial) == [
        "heartbeat: [('self', <_ParameterKind.POSITIONAL_OR_KEYWORD: 1>), "
        "('the_lease', <_ParameterKind.POSITIONAL_OR_KEYWORD: 1>)] (the contract says "
        "[('self', <_ParameterKind.POSITIONAL_OR_KEYWORD: 1>), "
        "('lease', <_ParameterKind.POSITIONAL_OR_KEYWORD: 1>)])"
    ]

    class Lacking:
        alias: str

    assert "claim" in missing(Lacking)
    assert "alias" not in missing(Lacking)
