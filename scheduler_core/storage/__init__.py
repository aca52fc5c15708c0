"""The storage layer: one driver per database (``postgres.py``, ``sqlite.py``) implementing the
same named operations (``base.Driver``), chosen once per alias (``drivers.driver()``). All vendor
SQL and every vendor branch live here; every write on behalf of an attempt is guarded by state
and fence."""
