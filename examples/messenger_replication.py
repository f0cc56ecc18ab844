"""Seed 003's replication example with the durable messenger, as two processes.

    python examples/messenger_replication.py replica --store sqlite:///replica.db \
        --endpoint tcp://127.0.0.1:15445
    python examples/messenger_replication.py primary --store sqlite:///primary.db \
        --endpoint tcp://127.0.0.1:15445 --count 1000

The primary sends records; it does not trust "sent": the replica persists each record
(in the transaction in which the messenger marks the message seen) and replies, and only
that reply marks the record replicated on the primary (again in the messenger's
transaction). Either process may be killed with SIGKILL at any moment and restarted:
every record is stored on the replica once and marked replicated on the primary once.
The primary writes its records and the messages in one transaction (an outbox), so a
restart neither skips nor repeats a record. It exits with 0 once every record is
replicated and acknowledged.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from typing import Any

import homing
from homing.messenger import Incoming, Messenger


def _setup(db: Any, table: str) -> None:
    with db.transaction() as t:
        # No unique constraint on purpose: a duplicate effect would stay countable.
        t.tx.execute(f"CREATE TABLE IF NOT EXISTS {table} (record TEXT NOT NULL)")
        t.tx.execute("CREATE TABLE IF NOT EXISTS example_progress (next_record INTEGER NOT NULL)")
        if t.tx.query_one("SELECT COUNT(*) FROM example_progress") == (0,):
            t.tx.execute("INSERT INTO example_progress (next_record) VALUES (0)")


def replica(args: argparse.Namespace) -> int:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    db = homing.connect(args.store)
    assert isinstance(db, homing.Database)
    _setup(db, "replica_records")

    def on_records(msg: Incoming) -> None:
        assert msg.tx is not None
        msg.tx.tx.execute("INSERT INTO replica_records (record) VALUES (?)", (msg.text,))
        msg.reply("persisted " + msg.text)

    with Messenger(args.name, db=db, retry_initial=args.retry) as m:
        m.listen(args.endpoint, on_records)
        print("replica listening", flush=True)
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
    db.close()
    return 0


def primary(args: argparse.Namespace) -> int:
    db = homing.connect(args.store)
    assert isinstance(db, homing.Database)
    _setup(db, "primary_replicated")

    def replicated(reply: Incoming) -> None:
        assert reply.tx is not None
        record = reply.text.removeprefix("persisted ")
        reply.tx.tx.execute("INSERT INTO primary_replicated (record) VALUES (?)", (record,))

    with Messenger(args.name, db=db, retry_initial=args.retry) as m:
        m.register_callback("replicated", replicated)
        while True:
            with db.transaction() as t:
                row = t.tx.query_one("SELECT next_record FROM example_progress")
                assert row is not None
                start = int(row[0])
                if start >= args.count:
                    break
                stop = min(args.count, start + args.batch)
                for i in range(start, stop):
                    m.send(args.endpoint, f"record-{i}", "replicated")
                t.tx.execute("UPDATE example_progress SET next_record = ?", (stop,))
            time.sleep(args.pace)
        while True:
            with db.transaction() as t:
                row = t.tx.query_one("SELECT COUNT(DISTINCT record) FROM primary_replicated")
            if row is not None and int(row[0]) >= args.count and m.wait_idle(0.05):
                break
            time.sleep(0.05)
        print("primary done", flush=True)
        # Acknowledgements of the last replies are still leaving; if they are lost, the
        # replica retransmits those replies until a primary is back to acknowledge them.
        time.sleep(args.linger)
    db.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("role", choices=["primary", "replica"])
    parser.add_argument("--store", required=True)
    parser.add_argument("--endpoint", default="tcp://127.0.0.1:15445")
    parser.add_argument("--name", default=None)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--retry", type=float, default=1.0)
    parser.add_argument("--pace", type=float, default=0.0, help="seconds between batches")
    parser.add_argument("--linger", type=float, default=1.0, help="seconds to stay when done")
    args = parser.parse_args(argv)
    args.name = args.name or args.role
    logging.basicConfig(level=logging.WARNING, format=f"{args.role}: %(message)s")
    return primary(args) if args.role == "primary" else replica(args)


if __name__ == "__main__":
    sys.exit(main())
