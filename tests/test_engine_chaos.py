"""Crash (SIGKILL) in the middle of routing, then restart: no message lost or duplicated.

Graph: ``in`` --MOVE(3 credits)--> ``mid`` --MOVE(2 credits)--> consumer ``c``, and
``in`` --COPY--> ``audit``. A producer process publishes messages with fixed ids and logs
each id once ``publish`` has returned (homing's promise point). A consumer process takes
from ``c`` and, in one transaction, writes an effect row (no unique constraint, so a
duplicate stays countable) and acks; the ack pays credits up the chain and routes held
messages on, through the failpoint ``engine.mid_route``. Both are SIGKILLed there, at
different hits, several times, concurrently; then restarted without faults and drained.
The checker: lost = acked ids without an effect = 0; duplicated = ids with more than one
effect = 0; unexpected = effects of ids never published = 0; every id copied to ``audit``
exactly once; the credit books balance and every credit is back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import homing
from homing.engine import Engine

N_MESSAGES = 24

CHILD = textwrap.dedent(
    """
    import os, sys, time
    import homing
    from homing.engine import Engine

    url, mode, ids_file, log_file = sys.argv[1:5]
    db = homing.connect(url)
    engine = Engine(db)
    if mode == "produce":
        ids = open(ids_file).read().split()
        done = set(open(log_file).read().split()) if os.path.exists(log_file) else set()
        with open(log_file, "a") as log:
            for i, mid in enumerate(ids):
                if mid in done:
                    continue
                engine.publish("in", {"i": i}, id=mid, headers={"n": i})
                log.write(mid + "\\n")
                log.flush()
                os.fsync(log.fileno())
    else:
        # Stop after the given idle time, but never while the producer still runs (on a
        # loaded machine it can pause longer than that, and a consumer that left early was
        # never killed at its failpoint), nor before the first message (up to 30 s).
        producer = os.environ.get("PRODUCER_PID")

        def producer_running():
            try:
                with open(f"/proc/{producer}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] != "Z"
            except (OSError, TypeError):
                return False

        idle_since, idle_limit = time.monotonic(), 30.0
        while time.monotonic() - idle_since < idle_limit or producer_running():
            got = engine.take("c", limit=2, lease_for=0.5)
            if not got:
                time.sleep(0.05)
                continue
            idle_since, idle_limit = time.monotonic(), float(mode.split(":")[1])
            for d in got:
                with db.transaction() as t:
                    t.tx.execute("INSERT INTO effects (id) VALUES (?)", (d.id,))
                    engine.ack(d)
    db.close()
    """
)


def _spawn(
    script: Path,
    url: str,
    mode: str,
    ids: Path,
    log: Path,
    fail: str | None,
    producer: subprocess.Popen[bytes] | None = None,
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("HOMING_FAILPOINTS", "PRODUCER_PID")}
    if fail:
        env["HOMING_FAILPOINTS"] = fail
    if producer is not None:
        env["PRODUCER_PID"] = str(producer.pid)
    return subprocess.Popen(
        [sys.executable, str(script), url, mode, str(ids), str(log)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _finish(p: subprocess.Popen[bytes], timeout: float = 60) -> int:
    _, err = p.communicate(timeout=timeout)
    if p.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"child failed ({p.returncode}): {err.decode()[-2000:]}")
    return int(p.returncode)


def test_sigkill_mid_route_loses_and_duplicates_nothing(
    store_url: str, tmp_path: Path, open_db: object
) -> None:
    db = homing.connect(store_url)
    assert isinstance(db, homing.Database)
    try:
        engine = Engine(db)
        engine.create_queue("in")
        engine.create_queue("mid")
        engine.create_queue("audit", max_history=None)
        engine.bind("in", "audit", to="audit", mode="copy")
        engine.bind("in", "to-mid", to="mid", credits=3)
        engine.bind("mid", "consumer", consumer="c", credits=2)
        with db.store.transaction() as tx:
            tx.execute("CREATE TABLE effects (id TEXT NOT NULL)")

        script = tmp_path / "child.py"
        script.write_text(CHILD)
        ids_file = tmp_path / "ids.txt"
        ids = [homing.uuid7() for _ in range(N_MESSAGES)]
        ids_file.write_text("\n".join(ids))
        log = tmp_path / "acked.txt"

        kills = 0
        # Rounds of a producer and a consumer running at once, each killed at a different
        # hit of the failpoint in the middle of routing.
        for producer_hit, consumer_hit in ((9, 2), (15, 4), (11, 3)):
            prod = _spawn(
                script,
                store_url,
                "produce",
                ids_file,
                log,
                f"engine.mid_route={producer_hit}*crash",
            )
            cons = _spawn(
                script,
                store_url,
                "consume:0.8",
                ids_file,
                log,
                f"engine.mid_route={consumer_hit}*crash",
                producer=prod,
            )
            outcome = (_finish(prod), _finish(cons))
            kills += sum(rc == -signal.SIGKILL for rc in outcome)
            assert engine.check() == []  # the books balance after every crash
        assert kills >= 4, f"only {kills} of 6 processes were killed: the test proved little"

        # Restart without faults: publish what is left, then drain.
        assert _finish(_spawn(script, store_url, "produce", ids_file, log, None)) == 0
        deadline = time.monotonic() + 60
        while True:
            assert _finish(_spawn(script, store_url, "consume:0.6", ids_file, log, None)) == 0
            info = {q.name: q for q in engine.queues()}
            if (
                info["in"].ready
                + info["in"].outstanding
                + info["mid"].ready
                + info["mid"].outstanding
                == 0
            ):
                break
            assert time.monotonic() < deadline, "the drain did not finish"

        acked = log.read_text().split()
        with db.store.transaction() as tx:
            effects = Counter(str(r[0]) for r in tx.query("SELECT id FROM effects"))
        lost = set(acked) - set(effects)
        duplicated = {i: n for i, n in effects.items() if n > 1}
        unexpected = set(effects) - set(ids)
        assert (len(lost), len(duplicated), len(unexpected)) == (0, 0, 0), (
            lost,
            duplicated,
            unexpected,
        )
        assert set(acked) == set(ids)  # the restarted producer published every message
        audit = Counter(m.id for m in engine.messages("audit", limit=10_000))
        assert audit == Counter(ids), "COPY made a message twice or lost it across crashes"
        assert engine.check() == []
        assert {(s.name, s.credits, s.granted) for s in engine.selectors() if s.mode == "move"} == {
            ("to-mid", 3, 3),
            ("consumer", 2, 2),
        }
    finally:
        db.close()
