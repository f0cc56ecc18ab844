"""Statements and transactions a sessions round trip sends to PostgreSQL, by side.

    PYTHONPATH=<tree>/src python bench/sessions_statements.py [URL]

One client and two servers (threads of this process, as in ``bench/sessions_roundtrip.py``'s
"one process" rows), 50 round trips of warm-up, then 300 counted: statements sent through
psycopg cursors and transactions opened (each also a BEGIN and a COMMIT), per round trip,
for the client's thread and the servers' threads. Prints the rate too (noisy; the counts
are the point).
"""

import collections
import sys
import threading
import time
from typing import Any

import psycopg

import homing
from homing.sessions import Server, Sessions

url = (
    sys.argv[1]
    if len(sys.argv) > 1
    else "postgresql://postgres@127.0.0.1:5432/test?schema=bench_sessions_stmts"
)
db = homing.connect(url, pool_size=8)
assert isinstance(db, homing.Database)
counts: collections.Counter[tuple[str, str]] = collections.Counter()
orig = psycopg.Cursor.execute


def w(self: Any, query: Any, *a: Any, **k: Any) -> Any:
    who = "server" if threading.current_thread().name.startswith("srv") else "client"
    counts[(who, "stmt")] += 1
    return orig(self, query, *a, **k)


psycopg.Cursor.execute = w  # type: ignore[method-assign]
otx = psycopg.Connection.transaction


def wt(self: Any, *a: Any, **k: Any) -> Any:
    who = "server" if threading.current_thread().name.startswith("srv") else "client"
    counts[(who, "tx")] += 1
    return otx(self, *a, **k)


psycopg.Connection.transaction = wt  # type: ignore[method-assign]
stop = threading.Event()
servers = [Server(db, "bench", lambda r, t: r.body) for _ in range(2)]
ths = [
    threading.Thread(target=srv.run, args=(stop,), kwargs={"idle_wait": 0.05}, name=f"srv{i}")
    for i, srv in enumerate(servers)
]
for t in ths:
    t.start()
s = Sessions(db).open("cnt")
for i in range(50):
    r = s.submit("bench", {"n": i})
    s.take_reply(request_id=r.id, timeout=30)
counts.clear()
N = 300
t0 = time.perf_counter()
for i in range(N):
    r = s.submit("bench", {"n": i})
    s.take_reply(request_id=r.id, timeout=30)
dt = time.perf_counter() - t0
stop.set()
for t in ths:
    t.join()
print(
    f"{N / dt:.1f} round trips/s; per round trip:",
    {f"{k[0]} {k[1]}": round(v / N, 2) for k, v in sorted(counts.items())},
)
db.close()
