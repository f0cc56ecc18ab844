"""Crash and network-fault proofs for reliable HTTP (seed 000): count every effect.

The sender and the receiver run as real processes (uvicorn, httpx). Failpoints SIGKILL
them at the risky steps; a small asyncio TCP proxy drops requests, drops responses (the
lost ack), duplicates requests, delays them and resets connections mid-body. After a
restart and a drain the checker demands lost = 0, duplicated = 0, unexpected = 0. The
receiver's handler also fails once for every 7th message after writing its effect (a
flaky dependency): that write must be undone and the failure recorded, never doubled.

This file is also the entry point of those processes: ``python test_http_chaos.py
receiver|sender ...``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import homing

HERE = Path(__file__).resolve()
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mode_of(i: int) -> str:
    return "job" if i % 10 == 0 else ("put" if i % 3 == 0 else "send")


# -- the processes ----------------------------------------------------------------------
def query_all(urls: str, sql: str) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` on every store of ``urls`` (comma-separated: the shards)."""
    rows: list[tuple[Any, ...]] = []
    for url in urls.split(","):
        db = homing.connect(url)
        assert isinstance(db, homing.Database)
        try:
            with db.store.transaction(write=False) as tx:
                rows += tx.query(sql)
        finally:
            db.close()
    return rows


def run_receiver(store_url: str, port: int) -> None:
    import uvicorn

    from homing.http import Receiver, RetryPolicy
    from homing.http.sharded import ShardedReceiver

    db = homing.connect(store_url.split(","))
    kind = ShardedReceiver if isinstance(db, homing.ShardedDatabase) else Receiver
    receiver = kind(
        db,  # type: ignore[arg-type]
        allowed_hosts=["127.0.0.1"],
        handler_retry=RetryPolicy(initial=0.05, maximum=0.5),
        dispatcher_options={
            "allowed_hosts": ["127.0.0.1"],
            "retry": RetryPolicy(initial=0.05, maximum=0.5),
            "request_timeout": 3.0,
        },
        **at_receipt_option(),
    )

    failed_once: set[int] = set()

    @receiver.node("/effect")
    def effect(body: Any, tx: homing.Transaction) -> Any:
        k = int(body["k"])
        tx.tx.execute("INSERT INTO effects (k) VALUES (?)", (k,))
        if k % 7 == 0 and k not in failed_once:  # a flaky dependency: the write is undone
            failed_once.add(k)
            raise RuntimeError(f"the dependency failed for {k}")
        return {"k": body["k"], "done": True}

    app: Any = receiver.app
    batch_log = os.environ.get("HOMING_CHAOS_BATCH_LOG")
    if batch_log:  # the test checks that batches really came
        inner = app

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["path"].endswith("/_homing/batch"):
                with open(batch_log, "a") as f:
                    f.write("batch\n")
            await inner(scope, receive, send)

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="on"))
    server.run(sockets=[sock])


def at_receipt_option() -> dict[str, float]:
    """The receiver's handle_at_receipt_below from the test's environment (by default
    the receiver's own, which a loaded machine may keep a writing handler above)."""
    value = os.environ.get("HOMING_CHAOS_AT_RECEIPT_BELOW")
    return {"handle_at_receipt_below": float(value)} if value else {}


def run_sender(store_url: str, target: str, reply_port: int, reply_base: str, n: int) -> None:
    from homing.http import Receiver, RetryPolicy, Sender
    from homing.http.sharded import ShardedReceiver, ShardedSender
    from homing.http.testing import serve_in_thread

    db = homing.connect(store_url.split(","))
    sharded = isinstance(db, homing.ShardedDatabase)
    replies = (ShardedReceiver if sharded else Receiver)(
        db,  # type: ignore[arg-type]
        allowed_hosts=["127.0.0.1"],
        dispatch=False,
    )
    with (
        serve_in_thread(replies.app, port=reply_port),
        (ShardedSender if sharded else Sender)(
            db,  # type: ignore[arg-type]
            allowed_hosts=["127.0.0.1"],
            retry=RetryPolicy(initial=0.05, maximum=0.5),
            request_timeout=3.0,
            per_destination=32,
            batch=int(os.environ.get("HOMING_CHAOS_BATCH", "0")),
        ) as sender,
    ):
        done = {int(r[0]) for r in query_all(store_url, "SELECT k FROM produced")}
        todo = [i for i in range(n) if i not in done]
        for start in range(0, len(todo), 100):
            with db.transaction() as t:  # the transactional outbox: produced + message
                for i in todo[start : start + 100]:
                    t.tx.execute("INSERT INTO produced (k) VALUES (?)", (i,))
                    kind = mode_of(i)
                    sender.enqueue(
                        kind,
                        target + "/effect",
                        {"k": i},
                        local_url=reply_base + "/_homing/reply" if kind == "job" else None,
                        tx=t,
                    )
        rows = query_all(store_url, "SELECT id, kind FROM homing_http_outbox")
        for msg_id, kind in rows:
            result = sender.wait(str(msg_id), timeout=120)
            if kind in ("put", "job"):
                assert result["done"] is True, result
    print(json.dumps({"waited": len(rows)}))


# -- the proxy ------------------------------------------------------------------------------
class ChaosProxy:
    """TCP proxy that frames HTTP/1.1 messages and injects faults per request."""

    FAULTS = ("drop_request", "drop_response", "duplicate", "delay", "reset")

    def __init__(self, upstream_port: int, seed: int, rate: float) -> None:
        self.upstream_port = upstream_port
        self.rng = random.Random(seed)
        self.rate = rate
        self.port = free_port()
        self.counts: Counter[str] = Counter()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        self._ready.wait(5)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._client, "127.0.0.1", self.port)
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def close(self) -> None:
        async def shutdown() -> None:
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    @staticmethod
    async def _read(reader: asyncio.StreamReader, response: bool) -> bytes | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            return None
        lines = head.split(b"\r\n")
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        if response:
            status = int(lines[0].split()[1])
            if status in (204, 304) or status < 200:
                length = 0
        try:
            return head + await reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None

    async def _duplicate(self, request: bytes) -> None:
        try:
            r, w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            w.write(request)
            await w.drain()
            await asyncio.wait_for(self._read(r, True), 5)
            w.close()
        except (OSError, TimeoutError):
            pass

    async def _client(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        try:
            ureader, uwriter = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            cwriter.close()
            return
        try:
            while True:
                request = await self._read(creader, False)
                if request is None:
                    break
                fault = self.rng.choice(self.FAULTS) if self.rng.random() < self.rate else "pass"
                self.counts[fault] += 1
                if fault == "drop_request":
                    break
                if fault == "reset":
                    uwriter.write(request[: len(request) // 2])
                    await uwriter.drain()
                    for w in (cwriter, uwriter):
                        sock = w.get_extra_info("socket")
                        if sock is not None:
                            sock.setsockopt(
                                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                            )
                    break
                if fault == "delay":
                    await asyncio.sleep(self.rng.uniform(0.01, 0.2))
                if fault == "duplicate":
                    asyncio.ensure_future(self._duplicate(request))
                uwriter.write(request)
                await uwriter.drain()
                response = await self._read(ureader, True)
                if response is None or fault == "drop_response":
                    break
                cwriter.write(response)
                await cwriter.drain()
        except ConnectionError:
            pass
        finally:
            for w in (cwriter, uwriter):
                w.close()


# -- the harness ----------------------------------------------------------------------------
class Scenario:
    def __init__(self, stores: Any, tmp: Path, shards: int = 1) -> None:
        """``shards`` > 1: each side's store is that many PostgreSQL shards."""
        self.sender_url = ",".join(stores.url(f"sender{i}") for i in range(shards))
        self.receiver_url = ",".join(stores.url(f"receiver{i}") for i in range(shards))
        for urls, table in ((self.sender_url, "produced"), (self.receiver_url, "effects")):
            for url in urls.split(","):
                db = homing.connect(url)
                assert isinstance(db, homing.Database)
                with db.store.transaction() as tx:
                    tx.execute(f"CREATE TABLE {table} (k INTEGER NOT NULL)")  # no unique: dups
                db.close()
        self.rport = free_port()
        self.sport = free_port()
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.files: list[Any] = []
        self.restarts: Counter[str] = Counter()

    def spawn(self, role: str, args: list[str], failpoints: str | None) -> subprocess.Popen[bytes]:
        env = {**os.environ, "HOMING_FAILPOINTS": failpoints or ""}
        log = open(self.tmp / f"{role}-{len(self.procs)}.log", "wb")
        self.files.append(log)
        p = subprocess.Popen([PY, str(HERE), role, *args], env=env, stdout=log, stderr=log)
        self.procs.append(p)
        return p

    def receiver(self, fp: str | None) -> subprocess.Popen[bytes]:
        return self.spawn("receiver", [self.receiver_url, str(self.rport)], fp)

    def sender(self, target: str, reply_base: str, n: int, fp: str | None) -> Any:
        args = [self.sender_url, target, str(self.sport), reply_base, str(n)]
        return self.spawn("sender", args, fp)

    def run(
        self,
        n: int,
        *,
        sender_fps: list[str] | None = None,
        receiver_fps: list[str] | None = None,
        target: str | None = None,
        reply_base: str | None = None,
        budget: float = 60.0,
    ) -> dict[str, Any]:
        """Run until the sender drained; each SIGKILLed process is restarted with the next
        failpoint spec of its list (then without failpoints)."""
        target = target or f"http://127.0.0.1:{self.rport}"
        reply_base = reply_base or f"http://127.0.0.1:{self.sport}"
        sfps, rfps = list(sender_fps or []), list(receiver_fps or [])
        t0 = time.monotonic()
        receiver = self.receiver(rfps.pop(0) if rfps else None)
        sender = self.sender(target, reply_base, n, sfps.pop(0) if sfps else None)
        try:
            while True:
                assert time.monotonic() - t0 < budget, f"no drain within {budget}s: {self.logs()}"
                if receiver.poll() is not None:
                    assert receiver.returncode == -signal.SIGKILL, self.logs()
                    self.restarts["receiver"] += 1
                    receiver = self.receiver(rfps.pop(0) if rfps else None)
                if sender.poll() is not None:
                    if sender.returncode == 0:
                        break
                    assert sender.returncode == -signal.SIGKILL, self.logs()
                    self.restarts["sender"] += 1
                    sender = self.sender(target, reply_base, n, sfps.pop(0) if sfps else None)
                time.sleep(0.05)
            return self.check(n, t0)
        finally:
            for p in self.procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for f in self.files:
                f.close()

    def logs(self) -> str:
        return "\n".join(
            f"--- {f.name}\n{f.read_text()[-2000:]}" for f in sorted(self.tmp.glob("*.log"))
        )

    def check(self, n: int, t0: float) -> dict[str, Any]:
        produced = [int(r[0]) for r in query_all(self.sender_url, "SELECT k FROM produced")]
        states: Counter[str] = Counter()
        for state, count in query_all(
            self.sender_url, "SELECT state, COUNT(*) FROM homing_http_outbox GROUP BY state"
        ):
            states[str(state)] += int(count)
        deadline = time.monotonic() + 20  # Option 2 handling runs after the 204
        while True:
            seen = Counter(int(r[0]) for r in query_all(self.receiver_url, "SELECT k FROM effects"))
            left = [
                (
                    sum(
                        int(r[0])
                        for r in query_all(
                            self.receiver_url,
                            "SELECT COUNT(*) FROM homing_http_inbox WHERE state = 'received'",
                        )
                    ),
                )
            ]
            if (len(seen) >= len(set(produced)) and left[0][0] == 0) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        acked = set(produced)
        report = {
            "messages": n,
            "acked": len(acked),
            "lost": len(acked - set(seen)),
            "duplicated": sum(1 for c in seen.values() if c > 1),
            "unexpected": len(set(seen) - acked),
            "double_produced": len(produced) - len(acked),
            "outbox": dict(states),
            "inbox_unhandled": left[0][0],
            "restarts": dict(self.restarts),
            "drain_s": round(time.monotonic() - t0, 2),
        }
        assert report["acked"] == n, report
        assert report["lost"] == 0 and report["duplicated"] == 0, report
        assert report["unexpected"] == 0 and report["double_produced"] == 0, report
        assert dict(states) == {"delivered": n}, report
        assert report["inbox_unhandled"] == 0, report
        return report


# Every failpoint of TESTING.md, two sweeps per backend: the first spec of a list crashes
# the first process, the second its restart; the checker runs after the final drain.
CRASHES = [
    (
        ["http.sender.after_outbox_insert=1*crash", "http.sender.before_request=5*crash"],
        [
            "http.receiver.after_inbox_insert=3*crash",
            "http.receiver.in_handler_before_commit=4*crash",
        ],
    ),
    (
        [
            "http.sender.after_2xx_before_tombstone=5*crash",
            "http.sender.after_tombstone_before_delete=2*crash",
        ],
        ["http.receiver.after_commit_before_response=4*crash"],
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("sender_fps,receiver_fps", CRASHES, ids=["early", "late"])
def test_sigkill_at_every_failpoint_then_drain(
    stores: Any, tmp_path: Path, sender_fps: list[str], receiver_fps: list[str]
) -> None:
    scenario = Scenario(stores, tmp_path)
    report = scenario.run(30, sender_fps=sender_fps, receiver_fps=receiver_fps, budget=90)
    # every failpoint really fired: one SIGKILL (and restart) per spec
    assert report["restarts"] == {"sender": len(sender_fps), "receiver": len(receiver_fps)}, report
    print(report)


@pytest.mark.slow
def test_sigkill_inside_the_commit_that_stores_and_handles(
    stores: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message is handled at receipt once its node's handler proved short: the receiver
    is killed after such a handler ran, before the commit that would hold the entry, the
    handler's write and the done mark. Nothing of it stays; the sender's retry makes it
    once."""
    # a budget no handler run here exceeds: the crash must not wait on the machine's load
    monkeypatch.setenv("HOMING_CHAOS_AT_RECEIPT_BELOW", "0.5")
    scenario = Scenario(stores, tmp_path)
    fps = ["http.receiver.at_receipt_before_commit=12*crash"]
    report = scenario.run(90, receiver_fps=fps, budget=90)
    assert report["restarts"] == {"receiver": 1}, report
    print(report)


# The same sweeps with the sender batching its Option 2 messages (``batch_wire``): a
# crash before a batch's request, after its answer and before the outcomes are stored,
# and in the receiver after a batch was stored and before it answered.
BATCH_CRASHES = (
    [
        "http.sender.batch_after_2xx_before_tombstone=2*crash",
        "http.sender.batch_before_request=3*crash",
    ],
    ["http.receiver.batch_after_inbox_insert=2*crash"],
)


@pytest.mark.slow
def test_batches_sigkill_at_every_failpoint_then_drain(
    stores: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = tmp_path / "batches.log"
    monkeypatch.setenv("HOMING_CHAOS_BATCH", "16")
    monkeypatch.setenv("HOMING_CHAOS_BATCH_LOG", str(batches))
    scenario = Scenario(stores, tmp_path)
    sender_fps, receiver_fps = BATCH_CRASHES
    report = scenario.run(300, sender_fps=sender_fps, receiver_fps=receiver_fps, budget=120)
    assert report["restarts"] == {"sender": len(sender_fps), "receiver": len(receiver_fps)}, report
    report["batches"] = batches.read_text().count("batch") if batches.exists() else 0
    assert report["batches"] > 0, report  # the crashes hit batches, not only single requests
    print(report)


#: The issue asks for 5,000 messages; on this 2-core machine that takes 60-90 s per
#: backend, over the part's test budget, so the default suite runs 1,000 per backend.
CHAOS_MESSAGES = int(os.environ.get("HOMING_HTTP_CHAOS_MESSAGES", "1000"))


@pytest.mark.slow
@pytest.mark.parametrize("batch", [0, 16], ids=["alone", "batches"])
def test_proxy_chaos_messages(
    stores: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: int
) -> None:
    """Faults on the wire; with ``batch`` the sender's Option 2 messages go in batches,
    so a dropped, duplicated or reset request carries many messages at once."""
    batches = tmp_path / "batches.log"
    monkeypatch.setenv("HOMING_CHAOS_BATCH", str(batch))
    monkeypatch.setenv("HOMING_CHAOS_BATCH_LOG", str(batches))
    scenario = Scenario(stores, tmp_path)
    to_receiver = ChaosProxy(scenario.rport, seed=1, rate=0.1)
    to_sender = ChaosProxy(scenario.sport, seed=2, rate=0.1)
    try:
        report = scenario.run(
            CHAOS_MESSAGES if not batch else CHAOS_MESSAGES // 2,
            target=f"http://127.0.0.1:{to_receiver.port}",
            reply_base=f"http://127.0.0.1:{to_sender.port}",
            budget=60 + CHAOS_MESSAGES / 25,
        )
    finally:
        to_receiver.close()
        to_sender.close()
    faults = to_receiver.counts + to_sender.counts
    report["faults"] = dict(faults)
    report["batches"] = batches.read_text().count("batch") if batches.exists() else 0
    print(report)
    assert (report["batches"] > 0) == (batch > 0), report
    for kind in ChaosProxy.FAULTS:
        assert faults[kind] > 0, report  # every kind of fault was really injected


# -- the same proofs on sharded stores (issue 18): each side is two PostgreSQL shards -------
@pytest.fixture
def pg_stores(tmp_path: Path) -> Any:
    from tests.conftest import StoreFactory

    factory = StoreFactory("postgres", tmp_path)
    yield factory
    factory.cleanup()


@pytest.mark.slow
@pytest.mark.parametrize("sender_fps,receiver_fps", CRASHES, ids=["early", "late"])
def test_sharded_sigkill_at_every_failpoint_then_drain(
    pg_stores: Any, tmp_path: Path, sender_fps: list[str], receiver_fps: list[str]
) -> None:
    """Outbox rows and inbox rows live on the shard their message id picks; the crash sweep
    still ends with every message's effect exactly once, across both shards."""
    scenario = Scenario(pg_stores, tmp_path, shards=2)
    report = scenario.run(30, sender_fps=sender_fps, receiver_fps=receiver_fps, budget=120)
    assert report["restarts"] == {"sender": len(sender_fps), "receiver": len(receiver_fps)}, report
    print(report)


@pytest.mark.slow
def test_sharded_proxy_chaos_messages(pg_stores: Any, tmp_path: Path) -> None:
    """Duplicated, dropped, delayed and reset requests between two sharded stores: a repeat
    reaches the shard that holds the first copy, so it is dropped there."""
    scenario = Scenario(pg_stores, tmp_path, shards=2)
    to_receiver = ChaosProxy(scenario.rport, seed=3, rate=0.1)
    to_sender = ChaosProxy(scenario.sport, seed=4, rate=0.1)
    n = 300
    try:
        report = scenario.run(
            n,
            target=f"http://127.0.0.1:{to_receiver.port}",
            reply_base=f"http://127.0.0.1:{to_sender.port}",
            budget=60 + n / 10,
        )
    finally:
        to_receiver.close()
        to_sender.close()
    faults = to_receiver.counts + to_sender.counts
    report["faults"] = dict(faults)
    print(report)
    assert faults["duplicate"] > 0 and faults["drop_response"] > 0, report
    for url in scenario.receiver_url.split(","):  # both shards took part
        assert query_all(url, "SELECT COUNT(*) FROM homing_http_inbox")[0][0] > 0
    for url in scenario.sender_url.split(","):
        assert query_all(url, "SELECT COUNT(*) FROM homing_http_outbox")[0][0] > 0


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "receiver":
        run_receiver(sys.argv[2], int(sys.argv[3]))
    elif role == "sender":
        run_sender(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6]))


@pytest.mark.slow
def test_sharded_receiver_takes_no_batches_and_a_batching_sender_still_delivers(
    pg_stores: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch names no one message id, so a sharded receiver could not route it to the
    shard of each message: it does not offer batches, and a sender with ``batch`` sends
    each message alone there (each once, on its shard)."""
    batches = tmp_path / "batches.log"
    monkeypatch.setenv("HOMING_CHAOS_BATCH", "16")
    monkeypatch.setenv("HOMING_CHAOS_BATCH_LOG", str(batches))
    scenario = Scenario(pg_stores, tmp_path, shards=2)
    report = scenario.run(100, budget=90)
    assert not batches.exists(), report
