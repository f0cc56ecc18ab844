"""A consumer SIGKILLed while it holds messages: another consumer finishes them, once each.

Graph: ``work`` --MOVE(4 credits)--> consumer ``a`` and --MOVE(4 credits)--> consumer
``b``. Consumer ``a`` is a separate process: it takes messages, handles some (an effect
row and the ack in one transaction), then takes a batch and is SIGKILLed holding it, with
more messages given to it and not yet taken. Then ``a`` restarts and is SIGKILLed
again at the failpoint ``engine.mid_route`` (inside an ack's payment or a take's return of
lapsed messages). Consumer ``b`` (another process) then runs until every message has its
effect. Once ``a``'s leases lapse and ``a`` counts as absent
(``consumer_timeout``), its messages and credits go back to ``work`` and on to ``b``.
The checker: lost = 0, duplicated = 0, unexpected = 0; the books balance, every credit is
back, and ``a`` really died holding messages.
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

N_MESSAGES = 40
TIMEOUT = 1.0  # consumer_timeout and lease: short, so the test is quick

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import homing
    from homing.engine import Engine

    url, name, die_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
    db = homing.connect(url)
    engine = Engine(db, consumer_timeout=float(sys.argv[4]))
    handled = 0
    idle = 0
    while idle < 20:
        got = engine.take(name, limit=3, lease_for=float(sys.argv[4]), wait=0.5)
        if not got:
            idle += 1
            continue
        idle = 0
        if die_after and handled >= die_after:
            with open(sys.argv[5], "w") as f:
                f.write(" ".join(d.id for d in got))
            os.kill(os.getpid(), signal.SIGKILL)  # holding these, no finally, no atexit
        for d in got:
            with db.transaction() as t:
                t.tx.execute("INSERT INTO effects (id) VALUES (?)", (d.id,))
                engine.ack(d)
            handled += 1
        if not die_after:
            with db.store.transaction() as tx:
                if tx.query_one("SELECT COUNT(DISTINCT id) FROM effects")[0] >= int(sys.argv[6]):
                    break
    db.close()
    """
)


def test_killed_consumers_messages_are_finished_once_by_another(
    store_url: str, tmp_path: Path
) -> None:
    db = homing.connect(store_url)
    assert isinstance(db, homing.Database)
    try:
        engine = Engine(db, consumer_timeout=TIMEOUT)
        engine.create_queue("work", max_history=None)
        engine.bind("work", "a", consumer="a", credits=4)
        engine.bind("work", "b", consumer="b", credits=4)
        with db.store.transaction() as tx:
            tx.execute("CREATE TABLE effects (id TEXT NOT NULL)")
        ids = [homing.uuid7() for _ in range(N_MESSAGES)]
        published = [engine.publish("work", {"i": i}, id=mid) for i, mid in enumerate(ids)]
        assert all(p.outcome in ("routed", "held") for p in published)

        script = tmp_path / "consumer.py"
        script.write_text(CHILD)
        held_file = tmp_path / "held.txt"
        env = {k: v for k, v in os.environ.items() if k != "HOMING_FAILPOINTS"}

        def spawn(name: str, die_after: int, fail: str | None = None) -> subprocess.Popen[bytes]:
            args = [name, str(die_after), str(TIMEOUT), str(held_file), str(N_MESSAGES)]
            return subprocess.Popen(
                [sys.executable, str(script), store_url, *args],
                env={**env, "HOMING_FAILPOINTS": fail} if fail else env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )

        a = spawn("a", 3)
        _, err = a.communicate(timeout=120)
        assert a.returncode == -signal.SIGKILL, err.decode()[-2000:]
        held = held_file.read_text().split()
        assert held, "a died holding nothing: the test proved little"
        outstanding_a = [m for m in engine.messages("work", state="outstanding", limit=1000)]
        assert any(m.consumer == "a" for m in outstanding_a), "a held no messages when killed"

        # "a" comes back and is killed again, this time in the middle of routing (inside an
        # ack's payment, or while its take returns lapsed messages to the queue).
        a = spawn("a", 0, "engine.mid_route=3*crash")
        _, err = a.communicate(timeout=120)
        assert a.returncode == -signal.SIGKILL, err.decode()[-2000:]
        assert engine.check() == []

        b = spawn("b", 0)
        _, err = b.communicate(timeout=180)
        assert b.returncode == 0, err.decode()[-2000:]

        with db.store.transaction() as tx:
            effects = Counter(str(r[0]) for r in tx.query("SELECT id FROM effects"))
        lost = set(ids) - set(effects)
        duplicated = {i: n for i, n in effects.items() if n > 1}
        unexpected = set(effects) - set(ids)
        assert (len(lost), len(duplicated), len(unexpected)) == (0, 0, 0), (
            lost,
            duplicated,
            unexpected,
        )
        assert set(held) <= set(effects)  # what a held when it died was finished by b
        deadline = time.monotonic() + 30
        while engine.queue("work").outstanding or engine.queue("work").ready:
            engine.sweep()  # a's offers lapse; nothing may stay behind
            assert time.monotonic() < deadline, engine.messages("work", limit=100)
            time.sleep(0.2)
        assert engine.check() == []
        assert {(s.name, s.credits, s.granted) for s in engine.selectors("work")} == {
            ("a", 4, 4),
            ("b", 4, 4),
        }
    finally:
        db.close()


PAUSED = textwrap.dedent(
    """
    import os, signal, sys
    import homing
    from homing.engine import Engine
    from homing.errors import HomingError

    url, held_file, refused_file, timeout = sys.argv[1:5]
    db = homing.connect(url)
    engine = Engine(db, consumer_timeout=float(timeout))
    got = []
    while not got:
        got = engine.take("a", limit=3, lease_for=float(timeout), wait=5)
    with open(held_file, "w") as f:
        f.write(" ".join(d.id for d in got))
    os.kill(os.getpid(), signal.SIGSTOP)  # paused past its lease; resumed by the test
    refused = 0
    for d in got:
        try:
            with db.transaction() as t:
                t.tx.execute("INSERT INTO effects (id) VALUES (?)", (d.id,))
                engine.ack(d)  # refused: the lease lapsed and b finished the message
        except HomingError:
            refused += 1
    with open(refused_file, "w") as f:
        f.write(str(refused))
    db.close()
    """
)


def test_paused_consumer_wakes_up_fenced(store_url: str, tmp_path: Path) -> None:
    """A consumer SIGSTOPped past its lease: another finishes its messages; when it wakes,
    its acks are refused and its effects roll back with them (exactly once)."""
    db = homing.connect(store_url)
    assert isinstance(db, homing.Database)
    try:
        engine = Engine(db, consumer_timeout=TIMEOUT)
        engine.create_queue("work", max_history=None)
        engine.bind("work", "a", consumer="a", credits=3)
        engine.bind("work", "b", consumer="b", credits=3)
        with db.store.transaction() as tx:
            tx.execute("CREATE TABLE effects (id TEXT NOT NULL)")
        n = 12
        ids = [homing.uuid7() for _ in range(n)]
        engine.publish_many("work", list(range(n)), ids=ids)
        script, paused = tmp_path / "consumer.py", tmp_path / "paused.py"
        script.write_text(CHILD)
        paused.write_text(PAUSED)
        held_file, refused_file = tmp_path / "held.txt", tmp_path / "refused.txt"
        env = {k: v for k, v in os.environ.items() if k != "HOMING_FAILPOINTS"}
        a = subprocess.Popen(
            [
                sys.executable,
                str(paused),
                store_url,
                str(held_file),
                str(refused_file),
                str(TIMEOUT),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 60
            while not (held_file.exists() and held_file.read_text()):
                assert a.poll() is None, a.communicate()[1].decode()[-2000:]
                assert time.monotonic() < deadline, "a never took a message"
                time.sleep(0.05)
            held = held_file.read_text().split()
            b = subprocess.Popen(
                [sys.executable, str(script), store_url, "b", "0", str(TIMEOUT), "-", str(n)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            _, err = b.communicate(timeout=180)
            assert b.returncode == 0, err.decode()[-2000:]
        finally:
            a.send_signal(signal.SIGCONT)
        _, err = a.communicate(timeout=60)
        assert a.returncode == 0, err.decode()[-2000:]
        assert int(refused_file.read_text()) == len(held) > 0
        with db.store.transaction() as tx:
            effects = Counter(str(r[0]) for r in tx.query("SELECT id FROM effects"))
        assert set(effects) == set(ids)
        assert {i: c for i, c in effects.items() if c > 1} == {}
        assert engine.check() == []
    finally:
        db.close()
