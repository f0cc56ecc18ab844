"""Round trips to PostgreSQL of each step of a sessions request/reply, counted by time.

    PYTHONPATH=<tree>/src .venv/bin/python bench/sessions_proxy_roundtrips.py [--delay-ms 25]

One client and one server in this process reach the server through
``bench/latency_proxy.py`` (on threads here) with ``--delay-ms`` added each way, so that a
round trip costs ~50 ms and dwarfs everything else: each step's time divided by a
``SELECT 1`` round trip's is how many round trips it made. Steps: ``submit`` (Transactions
0 and 1), the server's ``process_one`` (take, Transaction 2), the client's ``take_reply``
(a read, Transaction 3). After one warm-up request, ``--requests`` of them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import homing
from bench.latency_proxy import LatencyProxy, round_trip_s
from homing.sessions import Server, Sessions

PG = os.environ.get("HOMING_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay-ms", type=float, default=25.0, help="added each way")
    ap.add_argument("--requests", type=int, default=3)
    args = ap.parse_args()
    proxy = LatencyProxy.before(PG, args.delay_ms / 1000)
    proxy.start()
    far = proxy.url(PG)
    rtt = round_trip_s(far)
    schema = "bench_sessions_proxy_rt"
    homing.connect(f"{PG}?schema={schema}").close()  # migrated without the delay
    db = homing.connect(f"{far}?schema={schema}", migrate=False, pool_size=4)
    assert isinstance(db, homing.Database)
    try:
        session = Sessions(db).open(f"rt-{time.time_ns()}")
        server = Server(db, "rt", lambda request, txn: request.body)
        session.submit("rt", {"warm": 1})
        server.process_one()
        session.take_reply(timeout=5)
        print(f"# {homing.__file__}: a round trip {rtt * 1000:.1f} ms")
        for i in range(args.requests):
            t0 = time.perf_counter()
            request = session.submit("rt", {"i": i})
            t1 = time.perf_counter()
            server.process_one()
            t2 = time.perf_counter()
            session.take_reply(request_id=request.id, timeout=5)
            t3 = time.perf_counter()
            print(
                f"submit {(t1 - t0) / rtt:5.2f}  server process_one {(t2 - t1) / rtt:5.2f}  "
                f"take_reply {(t3 - t2) / rtt:5.2f}  round trips"
            )
    finally:
        db.close()
        proxy.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
