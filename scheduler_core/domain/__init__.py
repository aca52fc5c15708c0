"""The pure rules: lifecycle states and transitions, error classes, retry and backoff, effect
modes and their guarantees, outcome decisions, schedule specs, the job spec (``options``). No
Django, no database, no clock but the one passed in."""
