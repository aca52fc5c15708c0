"""Counts database statements and connections in every benchmark process that sets
``BENCH_STMT_DIR``, whatever system the process runs.

Each process (and each forked child) keeps two 64-bit counters in a small memory-mapped file
``<BENCH_STMT_DIR>/<pid>.cnt``: statements sent through psycopg cursors and connections
opened. A memory map needs no flushing, so the counts survive a process that ends with
``os._exit`` or a signal; the harness adds up every file after a run.
"""

from __future__ import annotations

import os
import sys

if os.environ.get("BENCH_PATH_ONLY"):
    # A process running another revision's files (bench.systems.TenureBefore): the editable
    # install of this checkout would otherwise supply any module that revision lacks (such
    # as a template-tag package Django looks for), mixing the two revisions' code.
    sys.meta_path[:] = [
        f for f in sys.meta_path if "__editable__" not in str(getattr(f, "__module__", ""))
    ]

_DIR = os.environ.get("BENCH_STMT_DIR", "")

if _DIR:
    import functools
    import mmap
    import struct
    import threading

    _lock = threading.Lock()
    _state: dict[str, object] = {"pid": None, "mm": None}

    def _bump(slot: int) -> None:
        with _lock:
            pid = os.getpid()
            if _state["pid"] != pid:
                fd = os.open(os.path.join(_DIR, f"{pid}.cnt"), os.O_RDWR | os.O_CREAT, 0o644)
                os.ftruncate(fd, 16)
                _state["mm"] = mmap.mmap(fd, 16)
                os.close(fd)
                _state["pid"] = pid
            mm = _state["mm"]
            (n,) = struct.unpack_from("q", mm, slot * 8)  # type: ignore[arg-type]
            struct.pack_into("q", mm, slot * 8, n + 1)  # type: ignore[arg-type]

    def _counting(fn, slot):  # type: ignore[no-untyped-def]
        if getattr(fn, "_bench_counted", False):
            return fn
        if _is_coroutine(fn):

            @functools.wraps(fn)
            async def awrapper(*a, **k):  # type: ignore[no-untyped-def]
                _bump(slot)
                return await fn(*a, **k)

            awrapper._bench_counted = True  # type: ignore[attr-defined]
            return awrapper

        @functools.wraps(fn)
        def wrapper(*a, **k):  # type: ignore[no-untyped-def]
            _bump(slot)
            return fn(*a, **k)

        wrapper._bench_counted = True  # type: ignore[attr-defined]
        return wrapper

    def _is_coroutine(fn):  # type: ignore[no-untyped-def]
        import inspect

        return inspect.iscoroutinefunction(fn)

    try:
        import psycopg

        for cls in (psycopg.Cursor, psycopg.AsyncCursor):
            for meth in ("execute", "executemany"):
                setattr(cls, meth, _counting(getattr(cls, meth), 0))
        for cls in (psycopg.Connection, psycopg.AsyncConnection):
            original = cls.__dict__["connect"].__func__
            cls.connect = classmethod(_counting(original, 1))
        psycopg.connect = psycopg.Connection.connect  # the module alias was bound at import
    except ImportError:
        pass


def read_counts(directory: str) -> tuple[int, int]:
    """Statements and connections counted in ``directory`` by every process so far."""
    import struct

    stmts = conns = 0
    for name in os.listdir(directory):
        if name.endswith(".cnt"):
            with open(os.path.join(directory, name), "rb") as f:
                data = f.read(16).ljust(16, b"\0")
            s, c = struct.unpack("qq", data)
            stmts += s
            conns += c
    return stmts, conns
