"""The storage layer: one driver per database (``postgres.py``, ``sqlite.py``) implementing the
same contract (``contract.StorageDriver``; its shared parts assembled in ``base.Driver``), chosen
once per alias (``drivers.driver()``). All vendor SQL (named per database in
``pg_statements.py`` and ``sqlite_statements.py``) and every vendor branch live here; every
write on behalf of an attempt is guarded by state and fence."""
