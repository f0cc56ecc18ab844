"""Reliable HTTP between two stores: a shop sends orders to a warehouse exactly once.

Run it:  .venv/bin/python examples/http_orders.py
Or serve the warehouse node with the CLI:
    homing --db sqlite:///warehouse.db serve --setup examples.http_orders:setup
"""

from __future__ import annotations

import tempfile
from typing import Any

import homing
from homing.http import Receiver, Sender
from homing.http.testing import serve_in_thread


def reserve(body: Any, tx: homing.Transaction) -> Any:
    """The warehouse's handler: its write commits with the inbox entry, so it runs once."""
    tx.tx.execute("CREATE TABLE IF NOT EXISTS reservations (sku TEXT, qty INTEGER)")
    tx.tx.execute("INSERT INTO reservations (sku, qty) VALUES (?, ?)", (body["sku"], body["qty"]))
    return {"reserved": body["qty"], "sku": body["sku"]}


def setup(receiver: Receiver) -> None:
    """Used by ``homing serve --setup examples.http_orders:setup``."""
    receiver.add_node("/reserve", reserve)


def main() -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="homing-example-")
    shop = homing.connect(f"sqlite:///{tmp}/shop.db")
    warehouse = homing.connect(f"sqlite:///{tmp}/warehouse.db")
    assert isinstance(shop, homing.Database) and isinstance(warehouse, homing.Database)
    receiver = Receiver(warehouse, allowed_hosts=["127.0.0.1"])
    setup(receiver)
    shop_replies = Receiver(shop, allowed_hosts=["127.0.0.1"], dispatch=False)
    with (
        serve_in_thread(receiver.app) as wh,
        serve_in_thread(shop_replies.app) as sh,
        Sender(shop, allowed_hosts=["127.0.0.1"]) as sender,
    ):
        # Option 1: wait for the stored response
        answer = sender.put(wh + "/reserve", {"sku": "apple", "qty": 3})
        # the transactional outbox: the order row and the message commit together
        with shop.transaction() as tx:
            tx.tx.execute("CREATE TABLE IF NOT EXISTS orders (sku TEXT)")
            tx.tx.execute("INSERT INTO orders (sku) VALUES ('pear')")
            pending = sender.send(wh + "/reserve", {"sku": "pear", "qty": 1}, tx=tx)
        pending.wait(30)
        # a job: acked with 202, the result comes back to the shop's reply node
        job = sender.perform_job(wh + "/reserve", sh + "/_homing/reply", {"sku": "fig", "qty": 2})
    receiver.stop()
    with warehouse.store.transaction() as t:
        rows = t.query("SELECT sku, qty FROM reservations ORDER BY sku")
    shop.close()
    warehouse.close()
    result = {"put": answer, "job": job, "reservations": [list(r) for r in rows]}
    print(result)
    return result


if __name__ == "__main__":
    main()
