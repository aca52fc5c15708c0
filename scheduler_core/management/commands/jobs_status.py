"""``manage.py jobs_status [--json]``: the verdict (healthy, degraded, down) with its reasons,
counts by state and health, executors and the scheduler's liveness, stale writes."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from scheduler_core.read import failover, health, liveness


class Command(BaseCommand):
    help = (
        "Print the verdict with its reasons, job counts by state and health, live executors, "
        "the scheduler's liveness and refused stale writes."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **opts: Any) -> None:
        status = health.status()
        judged = liveness.assess(
            categories=status["health"],
            executors=status["executors"]["list"],
            pressure=status["database"],
            failed_over=status["failover"],
        )
        status["verdict"] = judged.as_dict()
        if opts["json"]:
            self.stdout.write(json.dumps(status, indent=2, sort_keys=True))
            return
        self.stdout.write(f"verdict:  {judged.verdict}")
        for r in judged.reasons:
            self.stdout.write(f"  {r.level}: {r.text}")
        sched = judged.scheduler
        if sched.alive and sched.seconds_ago is not None:
            said = f"alive, last beat {sched.seconds_ago:.0f} s ago"
        elif sched.stopped_at is not None:
            said = f"not running (stopped at {sched.stopped_at:%Y-%m-%d %H:%M:%S} UTC)"
        elif sched.last_beat is not None:
            said = f"not running (last beat {sched.seconds_ago or 0:.0f} s ago)"
        else:
            said = "not running (never seen)"
        self.stdout.write(f"scheduler: {said}")
        if judged.stopped_responding:
            self.stdout.write(f"executors stopped responding: {len(judged.stopped_responding)}")
        self.stdout.write("states:   " + "  ".join(f"{k}={v}" for k, v in status["states"].items()))
        self.stdout.write("health:   " + "  ".join(f"{k}={v}" for k, v in status["health"].items()))
        self.stdout.write(f"executors alive: {status['executors']['alive']}")
        self.stdout.write(f"stale writes refused: {status['stale_writes_refused']['total']}")
        fo = status["failover"]
        if fo.get("timeline_changed"):
            self.stdout.write("failover: " + failover.sentence(fo))
            for j in fo["jobs"]:
                self.stdout.write(
                    f"  job {j['job']}: fences {j['old_fences']} before the switch, "
                    f"{j['new_fences']} after"
                )
        db = status.get("database")
        if db:
            oldest = db["oldest_snapshot"]
            held = (
                f"pid {oldest['pid']} ({oldest['application'] or 'no application name'}, "
                f"{oldest['state']}) for {db['oldest_snapshot_seconds']:g} s"
                if oldest
                else "none"
            )
            verdict = "HELD BACK: end that session" if db["held_back"] else "not held back"
            self.stdout.write(
                f"database: oldest snapshot {held}; job table dead rows "
                f"{db['job_dead_rows']:,}; {verdict}"
            )
