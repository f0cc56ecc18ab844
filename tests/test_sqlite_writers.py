"""The writer lock that queues homing's SQLite writers across processes (WriterLock)."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import homing
from homing.store.sqlite import WriterLock


def test_a_forked_child_does_not_share_its_parents_turn(tmp_path: Path) -> None:
    lock = WriterLock(tmp_path / "x.db-homing.lock")
    lock.acquire()
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                fcntl.flock(lock._file(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os._exit(0)  # the parent's turn excludes the child
            os._exit(1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        lock.release()


def test_a_writer_waits_for_another_process_then_goes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    db = homing.connect(url)
    db.insert("job", {"i": 0})
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child holds a write transaction for 0.3 s
        child = homing.connect(url)
        with child.store.transaction() as tx:  # type: ignore[union-attr]
            tx.execute("UPDATE homing_jobs SET priority = 1")
            os.write(write, b"x")
            time.sleep(0.3)
        child.close()
        os._exit(0)
    os.read(read, 1)
    started = time.monotonic()
    db.insert("job", {"i": 1})  # waits for the child's turn to end, then commits
    waited = time.monotonic() - started
    os.waitpid(pid, 0)
    assert 0.1 < waited < 5.0
    with db.store.transaction(write=False) as tx:  # type: ignore[union-attr]
        assert tx.query("SELECT priority FROM homing_jobs ORDER BY seq") == [(1,), (0,)]
    db.close()
