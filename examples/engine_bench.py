"""Benchmark of the queue engine: messages/s through a MOVE chain and a COPY fan-out.

    .venv/bin/python examples/engine_bench.py [--n 2000] [--postgres URL] [--json]

Scenarios, each on SQLite (a temporary file) and PostgreSQL (a temporary schema):
- chain: q1 --MOVE--> q2 --MOVE--> q3 --MOVE--> consumer; publish N (one transaction each,
  in batches of 100 in one transaction, and with ``publish_many`` 100 at a time), then
  take+ack all (the acks pay credits back up the chain);
- busy ack: the time of one take+ack while 3,000 messages wait for another, busy selector;
- fanout: hub --COPY--> 10 queues; publish N (one transaction each).
Durable settings (SQLite synchronous=FULL, PostgreSQL synchronous_commit=on).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from typing import Any

import homing
from homing.engine import Engine

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"


def _chain(engine: Engine, n: int) -> None:
    engine.create_queue("q1", max_history=100)
    engine.create_queue("q2", max_history=100)
    engine.create_queue("q3", max_history=100)
    engine.bind("q1", "m", to="q2", credits=10 * n)
    engine.bind("q2", "m", to="q3", credits=10 * n)
    engine.bind("q3", "m", consumer="sink", credits=10 * n)


def _busy_ack(engine: Engine, waiting: int = 3000, acks: int = 50) -> float:
    """Milliseconds per ack on a queue where ``waiting`` messages wait for a busy selector
    (they match only it) while another selector is paid and takes the rest."""
    engine.create_queue("busy", max_history=100)
    engine.bind("busy", "stuck", consumer="stuck", match={"k": "stuck"}, credits=1)
    engine.bind("busy", "free", consumer="free", match={"k": "free"}, credits=1)
    engine.publish("busy", 0, headers={"k": "stuck"})
    for _ in range(0, waiting, 500):
        engine.publish_many("busy", list(range(500)), headers={"k": "stuck"})
    engine.publish_many("busy", list(range(acks)), headers={"k": "free"})
    t = time.perf_counter()
    for _ in range(acks):
        (d,) = engine.take("free")
        engine.ack(d)
    return 1000 * (time.perf_counter() - t) / acks


def bench(url: str, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    db = homing.connect(url)
    assert isinstance(db, homing.Database)
    try:
        engine = Engine(db)
        _chain(engine, n)
        t = time.perf_counter()
        for i in range(n):
            engine.publish("q1", {"i": i}, headers={"k": i % 3})
        out["chain_publish_per_s"] = n / (time.perf_counter() - t)
        t = time.perf_counter()
        for start in range(0, n, 100):
            with db.transaction():
                for i in range(start, min(n, start + 100)):
                    engine.publish("q1", {"i": i})
        out["chain_publish_batched100_per_s"] = n / (time.perf_counter() - t)
        t = time.perf_counter()
        for start in range(0, n, 100):
            engine.publish_many("q1", [{"i": i} for i in range(start, min(n, start + 100))])
        out["chain_publish_many100_per_s"] = n / (time.perf_counter() - t)
        t = time.perf_counter()
        acked = 0
        while True:
            got = engine.take("sink", limit=100)
            if not got:
                break
            with db.transaction():
                for d in got:
                    engine.ack(d)
            acked += len(got)
        out["chain_take_ack_per_s"] = acked / (time.perf_counter() - t)
        assert acked == 3 * n and engine.check() == []
        out["ack_ms_with_3000_waiting_for_a_busy_selector"] = _busy_ack(engine)

        engine.create_queue("hub", max_history=100)
        for k in range(10):
            engine.create_queue(f"sub{k}", max_history=100)
            engine.bind("hub", f"c{k}", to=f"sub{k}", mode="copy")
        t = time.perf_counter()
        for i in range(n):
            engine.publish("hub", {"i": i})
        elapsed = time.perf_counter() - t
        out["fanout10_publish_per_s"] = n / elapsed
        out["fanout10_copies_per_s"] = 10 * n / elapsed
        assert all(engine.queue(f"sub{k}").ready == n for k in range(10))
    finally:
        db.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--postgres", default=os.environ.get("HOMING_TEST_POSTGRES", DEFAULT_PG))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {"n": args.n}
    with tempfile.TemporaryDirectory() as tmp:
        results["sqlite"] = bench(f"sqlite:///{tmp}/bench.db", args.n)
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    sep = "&" if "?" in args.postgres else "?"
    try:
        results["postgres"] = bench(f"{args.postgres}{sep}schema={schema}", args.n)
    finally:
        import psycopg
        from psycopg import sql

        with psycopg.connect(args.postgres, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"queue engine, n={args.n} messages per scenario (durable commits)")
    for backend in ("sqlite", "postgres"):
        for key, value in results[backend].items():
            print(f"  {backend:9} {key:44} {value:10.1f}")


if __name__ == "__main__":
    main()
