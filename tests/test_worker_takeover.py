"""A restarted worker takes back, at once, the jobs its dead predecessor left leased
(``homing.worker.takeover``): real ``homing worker`` processes, SIGKILLed, on both
backends. The lease is 60 s, so a job done within seconds was taken back, not expired."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import homing
from homing.store import holders_queries as hq
from homing.worker import takeover

APPS = str(Path(__file__).with_name("test_worker_apps.py"))
EFFECTS_DDL = "CREATE TABLE effects (job_id TEXT NOT NULL, attempt INTEGER NOT NULL, pid INTEGER)"


def worker(url: str, name: str, log: Path) -> subprocess.Popen[bytes]:
    args = ["--app", f"{APPS}:app", "--concurrency", "1", "--lock-for", "60", "--name", name]
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "homing", "--db", url, "worker", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_for(check: Any, timeout: float, what: str) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"not within {timeout}s: {what}"
        time.sleep(0.05)
    return time.monotonic() - started


def state(db: homing.Database, job_id: str) -> tuple[str, int | None]:
    with db.store.transaction(write=False) as tx:
        row = tx.query_one(
            "SELECT j.state, h.pid FROM homing_jobs j "
            "LEFT JOIN homing_holders h ON h.id = j.holder_id WHERE j.id = ?",
            (job_id,),
        )
    assert row is not None
    return str(row[0]), row[1]


def effects(db: homing.Database) -> list[tuple[str, int]]:
    with db.store.transaction(write=False) as tx:
        return [(str(r[0]), int(r[1])) for r in tx.query("SELECT job_id, attempt FROM effects")]


def kill_holding(db: homing.Database, url: str, name: str, tmp_path: Path) -> str:
    """A worker named ``name`` takes a job that sleeps 60 s on its first attempt, and is
    SIGKILLed while it holds it; the job's id."""
    with db.transaction() as t:
        t.tx.execute(EFFECTS_DDL)
    job_id = db.insert("sleep_first", {"s": 60}).split(":")[-1]
    first = worker(url, name, tmp_path / "first.log")
    try:
        wait_for(lambda: state(db, job_id) == ("running", first.pid), 30, "the first worker's grab")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    return job_id


def after_restart(store_url: str, tmp_path: Path, dead: str, restarted: str, check: Any) -> Any:
    """Kill a worker named ``dead`` while it holds a job, start one named ``restarted``,
    and return ``check(db, job_id)`` (run while the second worker lives) and the db."""
    db = homing.connect(store_url)
    assert isinstance(db, homing.Database)
    job_id = kill_holding(db, store_url, dead, tmp_path)
    second = worker(store_url, restarted, tmp_path / "second.log")
    try:
        return check(db, job_id), db, job_id
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)


def test_a_restarted_worker_takes_back_its_dead_predecessors_job_at_once(
    store_url: str, tmp_path: Path
) -> None:
    def done(db: homing.Database, job_id: str) -> float:
        return wait_for(lambda: state(db, job_id)[0] == "done", 30, "the job, taken back")

    took, db, job_id = after_restart(store_url, tmp_path, "w-takeover", "w-takeover", done)
    assert took < 30  # the lease was 60 s: it was ended, not waited out
    assert effects(db) == [(job_id, 2)]  # once, by the second attempt
    history = [f.kind for f in db.details(job_id).failures]
    assert history == ["lease_expired"], history  # the takeover is on record
    db.close()


def test_a_worker_of_another_name_leaves_the_job_to_its_lease(
    store_url: str, tmp_path: Path
) -> None:
    def still_held(db: homing.Database, job_id: str) -> str:
        time.sleep(3)  # it started, grabbed what it could, and idles
        return state(db, job_id)[0]

    held, db, _ = after_restart(store_url, tmp_path, "w-dead", "w-other", still_held)
    assert held == "running"  # still the dead process's until its 60 s lease ends
    assert effects(db) == []
    db.close()


class _Named:
    def __init__(self, db: homing.Database, name: str) -> None:
        self.db, self.name, self.worker_id = db, name, f"{socket.gethostname()}:1:{name}"


def test_only_dead_processes_of_the_same_name_and_host_lose_their_leases(
    db: homing.Database,
) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer runs
    holders = {
        "dead-same": (gone.pid, "w1", socket.gethostname()),
        "alive-same": (subprocess.os.getppid(), "w1", socket.gethostname()),  # type: ignore[attr-defined]
        "dead-other-name": (gone.pid, "w2", socket.gethostname()),
        "dead-other-host": (gone.pid, "w1", "another-host"),
    }
    ids = {}
    for label in holders:
        ids[label] = db.insert("noop", {"label": label}).split(":")[-1]
    jobs = db.grab_many("noop", lock_for=600, limit=10)
    assert len(jobs) == 4
    with db.transaction() as t:
        for label, (pid, name, host) in holders.items():
            holder = hq.register_holder(t.tx, host, pid, f"{host}:{pid}:{name}", now=db.clock.now())
            t.tx.execute("UPDATE homing_jobs SET holder_id = ? WHERE id = ?", (holder, ids[label]))
    # never under the default name; under w1 only the dead process of this host
    assert takeover.take_back(_Named(db, "worker")) == 0  # type: ignore[arg-type]
    assert takeover.take_back(_Named(db, "w1")) == 1  # type: ignore[arg-type]
    with db.store.transaction(write=False) as tx:
        expiry = {
            label: tx.query_one("SELECT lease_expires_at FROM homing_jobs WHERE id = ?", (i,))
            for label, i in ids.items()
        }
        assert hq.leases_on_host(tx, "nobody") == []
    expired = {label for label, row in expiry.items() if row and row[0] <= db.clock.now()}
    assert expired == {"dead-same"}
