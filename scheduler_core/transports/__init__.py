"""Transports deliver wake-ups, never ownership: the database decides who runs a job.

``TENURE_TRANSPORT`` picks one: ``polling`` (broker-less; ``run_executor``), ``celery``
(primary) or ``rq``. Celery and RQ are imported only inside their adapters here
(:mod:`.celery`, :mod:`.rq`), which register their publisher with
:mod:`scheduler_core.api.hints` when loaded; :mod:`.checks` checks the broker settings.
"""
