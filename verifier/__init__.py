"""The fault verifier: a seeded fault-injection run that checks the guarantees with figures.

``manage.py chaos --seconds N --seed S`` builds a system of its own — a PostgreSQL cluster in a
temporary folder, the demo destinations, several executors and schedulers, a TCP proxy
between each executor and the database — runs a mixed workload of every effect mode while a
seeded nemesis injects faults, heals everything, lets the work drain, and then checks the
invariants of ``docs/reliability.md`` (I1-I17) against the database, the executors' event
logs and the destinations' own records.

Modules, bottom to top: :mod:`.plan` (the run's parameters), :mod:`.cluster` (the database),
:mod:`.proxy` (the links), :mod:`.skew` and :mod:`.fleet` (child processes, some on offset
clocks), :mod:`.nemesis` (faults), :mod:`.job_types` and :mod:`.workload` (what runs),
:mod:`.badinput` (the hostile-input sweep), :mod:`.truth` and :mod:`.evidence` (what the run
left behind), :mod:`.checker` (the verdicts), :mod:`.report` (the figures) and :mod:`.run`
(the whole run); :mod:`.failpoints` (the hooks it installs in the processes it starts:
``TENURE_FAILPOINTS`` and the ``TENURE_EVENT_LOG`` event log, :mod:`scheduler_core.hooks`) and
:mod:`.drivers` (the negative controls). A Django app of the example project's; nothing here
is imported by the scheduler itself.
"""

from __future__ import annotations

from .plan import Plan

__all__ = ["Plan"]
