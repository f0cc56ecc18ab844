"""Counts the SQLite write transactions of homing's delivery workers and webhook receiver.

Loaded by ``bench/pipeline_commits.py`` through PYTHONPATH into the processes a pipeline
run starts; active only when ``HOMING_TX_TRACE_DIR`` is set, and only in the delivery
worker and webhook receiver processes. Per (thread, caller) it sums the write
transactions, the seconds waited for the process's write lock and the seconds it was held
(BEGIN to COMMIT, the fsync included), and writes them to ``<dir>/<pid>.json`` every 2 s
and at exit. Not for production: it wraps ``SQLiteStore.transaction``.
"""

from __future__ import annotations

import os
import sys

_DIR = os.environ.get("HOMING_TX_TRACE_DIR")
_ARGV = " ".join(getattr(sys, "orig_argv", []))
_ROLE = (
    "worker"
    if "homing.pipeline.deliver" in _ARGV
    else "receiver"
    if "homing.pipeline.sinks hooks" in _ARGV
    else None
)

if _DIR and _ROLE:
    import atexit
    import contextlib
    import json
    import threading
    import time
    from collections import defaultdict
    from types import FrameType
    from typing import Any

    import homing.store.sqlite as _sqlite

    _stats: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    _local = threading.local()
    _last = [0.0]

    def _dump() -> None:
        out = {"role": _ROLE, "pid": os.getpid(), "stats": dict(_stats)}
        path = os.path.join(str(_DIR), f"{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(path + ".tmp", path)

    class _TimedLock:
        def __init__(self, lock: Any) -> None:
            self.lock = lock

        def acquire(self, timeout: float = -1) -> bool:
            got = self.lock.acquire(timeout=timeout)
            _local.acquired = time.perf_counter()
            return bool(got)

        def release(self) -> None:
            self.lock.release()

    _original = _sqlite.SQLiteStore.transaction.__wrapped__  # type: ignore[attr-defined]

    def _caller() -> str:
        frame: FrameType | None = sys._getframe(3)
        names: list[str] = []
        while frame is not None and len(names) < 3:
            name = frame.f_code.co_filename
            if "homing" in name and "contextlib" not in name and "store/sqlite" not in name:
                names.append(frame.f_code.co_name)
            frame = frame.f_back
        thread = threading.current_thread().name.split("_")[0]
        return f"{thread}: {'/'.join(names)}"

    @contextlib.contextmanager
    def _transaction(self: Any, *, write: bool = True) -> Any:
        if not isinstance(self._write_lock, _TimedLock):
            self._write_lock = _TimedLock(self._write_lock)
        if self._slot.get() is not None or not write:
            with contextlib.contextmanager(_original)(self, write=write) as tx:
                yield tx
            return
        key = _caller()
        start = time.perf_counter()
        _local.acquired = None
        try:
            with contextlib.contextmanager(_original)(self, write=write) as tx:
                yield tx
        finally:
            end = time.perf_counter()
            row = _stats[key]
            row[0] += 1
            if _local.acquired is not None:
                row[1] += _local.acquired - start
                row[2] += end - _local.acquired
            if time.monotonic() - _last[0] > 2.0:
                _last[0] = time.monotonic()
                _dump()

    _sqlite.SQLiteStore.transaction = _transaction  # type: ignore[method-assign]
    atexit.register(_dump)
