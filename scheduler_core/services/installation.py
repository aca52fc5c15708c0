"""Operator actions on the installation — show it, regenerate its id, adopt this database's
identity — for the command line and the start-up check alike.

The installation id is the first part of every new effect key; the identity recorded with it
says which database it was made for. A database restored or cloned elsewhere keeps the id but
reads another identity: :func:`status` says so (check ``tenure.W024`` at start-up). Then an
operator either *regenerates* the id (a copy running beside the original: its new effects get
keys of their own; every ledger row keeps the key it was recorded with) or *adopts* the
identity (the same installation, moved or restored in its place: the id stays, so the same
work keeps its keys). Each change is written through the storage driver with its audit row in
one transaction, and only while the id is still the one the change was decided against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..conf import tenure_settings
from ..domain import installation
from ..exceptions import ActionConflict, ActionRefused
from ..models import AuditEntry, Effect
from ..storage.drivers import driver

REASON_MAX_CHARS = 4000


@dataclass(frozen=True, kw_only=True)
class InstallationStatus:
    """The installation as this process sees it now."""

    in_force: str
    """The id new effect keys carry ("" while the database has made none)."""
    configured: bool
    """Whether ``TENURE_INSTALLATION_ID`` sets it (the database's own id is then unused)."""
    stored: str | None
    """The database's own id (None: not made yet; the first effect key makes it)."""
    recorded_identity: dict[str, str] = field(default_factory=dict)
    recorded_at: datetime | None = None
    current_identity: dict[str, str] = field(default_factory=dict)
    differences: list[str] = field(default_factory=list)
    """How this database differs from the recorded one (empty: the same, or not comparable)."""
    effects: int = 0
    """Ledger rows: each keeps the key it was recorded with whatever the id becomes (0 when
    not counted)."""

    @property
    def warning(self) -> str:
        """What ``tenure.W024`` says ("" when nothing is wrong)."""
        if not self.differences:
            return ""
        return installation.mismatch_text(
            in_force=self.in_force, configured=self.configured, differences=self.differences
        )

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``."""
        return {
            "installation_id": self.in_force,
            "source": "TENURE_INSTALLATION_ID" if self.configured else "database",
            "database_id": self.stored,
            "recorded_identity": self.recorded_identity,
            "recorded_at": self.recorded_at.isoformat() if self.recorded_at else None,
            "current_identity": self.current_identity,
            "differences": self.differences,
            "effects": self.effects,
            "warning": self.warning,
        }


@dataclass(frozen=True, kw_only=True)
class InstallationChange:
    """What an operator's action changed, and its audit row."""

    id_before: str
    id_after: str
    identity_before: dict[str, str]
    identity_after: dict[str, str]
    effects_keeping_keys: int
    audit: AuditEntry


def status(*, count_effects: bool = True) -> InstallationStatus:
    """The installation id in force, the recorded and the current database identity and how
    they differ, and (``count_effects``: a read of the whole ledger) how many effects are
    recorded. Reads only: an id not made yet stays unmade."""
    d = driver()
    configured = tenure_settings().INSTALLATION_ID
    with d.atomic():
        found = d.installation()
        current = d.database_identity()
        effects = Effect.objects.using(d.alias).count() if count_effects else 0
    recorded = found.identity if found else {}
    return InstallationStatus(
        in_force=configured or (found.key if found else ""),
        configured=bool(configured),
        stored=found.key if found else None,
        recorded_identity=recorded,
        recorded_at=found.identity_at if found else None,
        current_identity=current,
        differences=installation.identity_differences(recorded, current),
        effects=effects,
    )


def regenerate(*, actor: str, reason: str, new_id: str = "") -> InstallationChange:
    """Give this database a new installation id (``new_id``, or a random one) and record its
    identity with it: new effects get keys of their own; every ledger row keeps its key.
    Refused while ``TENURE_INSTALLATION_ID`` sets the id (change the setting instead), and
    for an id that cannot be one or is the current one."""
    configured = tenure_settings().INSTALLATION_ID
    if configured:
        raise ActionRefused(
            f"TENURE_INSTALLATION_ID={configured!r} sets the installation id: new effect keys "
            "carry it, not the database's own. Give this copy a value of its own in its "
            "settings instead."
        )
    if new_id:
        try:
            installation.check_installation_id(new_id)
        except ValueError as e:
            raise ActionRefused(str(e)) from None
    return _act("installation_regenerate", new_id=new_id, actor=actor, reason=reason)


def adopt(*, actor: str, reason: str) -> InstallationChange:
    """Record this database's identity as the installation's, keeping its id: the operator
    says this database is the same installation (moved, renamed, upgraded, restored in its
    place). Refused when there is nothing to adopt (the identities agree)."""
    return _act("installation_adopt", new_id="", actor=actor, reason=reason)


def _act(action: str, *, new_id: str, actor: str, reason: str) -> InstallationChange:
    reason = (reason or "").strip()
    if not reason:
        raise ActionRefused("a reason is required")
    if len(reason) > REASON_MAX_CHARS:
        raise ActionRefused(f"the reason is longer than {REASON_MAX_CHARS} characters")
    if not (actor or "").strip():
        raise ActionRefused("an actor is required")
    d = driver()
    with d.atomic():
        found = d.installation()
        current = d.database_identity()
        before_id = found.key if found else ""
        before_identity = found.identity if found else {}
        if action == "installation_adopt":
            if found is None:
                raise ActionRefused(
                    "this database has no installation id yet: the first effect key makes one "
                    "with its identity"
                )
            if before_identity == current:
                raise ActionRefused(
                    "this database's identity is the one recorded already; nothing to adopt"
                )
            after_id = before_id
        else:
            after_id = new_id or installation.new_installation_id(avoid=before_id)
            if after_id == before_id:
                raise ActionRefused(f"{after_id!r} is the installation id already")
        if not d.record_installation(
            expected=found.key if found else None, key=after_id, identity=current
        ):
            raise ActionConflict("the installation changed meanwhile; look again and decide")
        effects = Effect.objects.using(d.alias).count()
        audit = d.audit(
            job=None,
            actor=actor[:150],
            action=action,
            reason=reason,
            detail={
                "installation_before": before_id,
                "installation_after": after_id,
                "identity_before": before_identity,
                "identity_after": current,
                "effects_keeping_keys": effects,
            },
        )
    return InstallationChange(
        id_before=before_id,
        id_after=after_id,
        identity_before=before_identity,
        identity_after=current,
        effects_keeping_keys=effects,
        audit=audit,
    )
