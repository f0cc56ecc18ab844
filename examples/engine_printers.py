"""Seed 001's printer example and service lookup, end to end.

    .venv/bin/python examples/engine_printers.py [STORE_URL]

A print queue with two black-and-white printers (one credit each) and a colour job that
no printer matches; the exceptions go to a dead-letter queue; the printers pay for what
they print and the waiting job moves on; a request to a service that does not exist
bounces back to the caller's self-destructive reply queue.
"""

from __future__ import annotations

import logging
import sys
import tempfile

import homing
from homing.engine import DEAD_LETTERS, Engine


def main(url: str) -> None:
    db = homing.connect(url)
    assert isinstance(db, homing.Database)
    engine = Engine(db)

    engine.create_queue("print-exceptions")
    engine.create_queue("print", dead_letter="print-exceptions")
    for name in ("bw-1", "bw-2"):
        engine.bind("print", name, consumer=name, match={"color": False}, credits=1)

    for doc, colour in (("memo", False), ("report", False), ("photo", True), ("invoice", False)):
        r = engine.publish("print", {"doc": doc}, headers={"color": colour})
        print(f"publish {doc:8} colour={colour!s:5} -> {r.outcome}")
    print("credits:", {s.name: (s.credits, s.granted) for s in engine.selectors("print")})
    print("dead letters:", [(m.body, m.reason) for m in engine.dead_letters("print-exceptions")])

    for printer in ("bw-1", "bw-2", "bw-1", "bw-2"):
        for d in engine.take(printer):
            print(f"{printer} prints {d.body['doc']} and pays")
            engine.ack(d)

    # Service lookup: unknown service -> $dead -> bounced to the caller's reply queue.
    engine.bind(DEAD_LETTERS, "bounce", mode="bounce", credits=100)
    engine.create_queue("client-1", self_destruct=True)
    engine.bind("client-1", "reader", consumer="client-1")
    engine.publish("service.weather", {"city": "Brussels"}, return_address="client-1")
    (reply,) = engine.take("client-1")
    print(f"client-1 got back its request: no such service {reply.message.original_address!r}")
    engine.ack(reply)
    engine.unbind("client-1", "reader")
    print("client-1 queue gone:", "client-1" not in [q.name for q in engine.queues()])
    assert engine.check() == []
    db.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="log: %(message)s")
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(f"sqlite:///{tmp}/printers.db")
