"""Running claimed attempts: the attempt itself, its context, the heartbeat, committing and
reading back completions, group writes, the broker-less worker and the Celery chain."""
