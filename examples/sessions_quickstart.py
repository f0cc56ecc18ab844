"""Queued request/reply with a client session that recovers (homing.sessions, seed 004).

    python examples/sessions_quickstart.py [STORE_URL]

A client submits requests, a server answers them in one transaction each, the client takes
the replies; then the client "crashes" between its transactions and recovers.
"""

from __future__ import annotations

import sys
import tempfile
from typing import Any

import homing
from homing.sessions import Reply, Request, Server, Sessions


def price(request: Request, txn: homing.Transaction) -> Any:
    """Transaction 2: the server's writes through ``txn`` commit with the reply."""
    return {"sku": request.body["sku"], "total": request.body["qty"] * 3}


def main(url: str) -> dict[str, Any]:
    db = homing.connect(url)
    assert isinstance(db, homing.Database)
    sessions = Sessions(db)
    server = Server(db, "prices", price)

    session = sessions.open("shop-1")
    first = session.submit("prices", {"sku": "A-1", "qty": 2})  # Transactions 0 and 1
    server.run(until_idle=True)  # Transaction 2 (usually another process)
    reply = session.take_reply()  # Transaction 3
    assert reply is not None and reply.body["total"] == 6

    # The client builds a request (Transaction 0) and crashes before submitting it.
    session.prepare("prices", {"sku": "B-2", "qty": 5})
    session = sessions.open("shop-1")  # restart: the session is re-established
    report = session.recover()
    assert report.last is not None and report.last.state == "A"
    seen = [report.last.state]
    session.resubmit()  # A: resubmit (or session.drop())
    seen.append(session.recover().last.state)  # type: ignore[union-attr]  # B: wait
    server.run(until_idle=True)
    seen.append(session.recover().last.state)  # type: ignore[union-attr]  # C: process now

    def record(reply: Reply, txn: homing.Transaction) -> None:
        """Transaction 3: the client's own writes commit with the dequeue."""
        txn.insert("invoice", {"request": reply.request_id, "total": reply.body["total"]})

    second = session.take_reply(record)
    assert second is not None
    seen.append(session.recover().last.state)  # type: ignore[union-attr]  # D: continue
    session.confirm([first.id, second.request_id])  # durably recorded: forget them
    looked_up = sessions.lookup(first.id)
    db.close()
    return {"states": seen, "first_reply": looked_up.reply, "second_reply": second.body}


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else f"sqlite:///{tempfile.mkdtemp()}/sessions.db"
    print(main(target))
