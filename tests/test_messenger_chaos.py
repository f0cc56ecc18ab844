"""A lossy forwarding device between two messengers drops, duplicates and reorders frames in
both directions (messages, replies and acks), while a third peer sends forged frames
naming the real sender (batches, acks and refusals with guessed epochs); 20,000 messages
and their replies each take effect once."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import zmq

from homing.messenger import Incoming, Messenger, wire


class LossyProxy(threading.Thread):
    """ROUTER in front, one DEALER per client identity behind (same routing id), so replies
    and acks find their way back. Each frame set is dropped, duplicated, delayed or passed."""

    def __init__(self, backend: str, drop: float, dup: float, delay: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.backend, self.drop, self.dup, self.delay = backend, drop, dup, delay
        self.rng = random.Random(seed)
        self.ready = threading.Event()
        self.stopping = threading.Event()
        self.endpoint = ""
        self.faults: Counter[str] = Counter()

    def run(self) -> None:
        ctx = zmq.Context()
        front = ctx.socket(zmq.ROUTER)
        front.setsockopt(zmq.LINGER, 0)
        front.bind("tcp://127.0.0.1:0")
        self.endpoint = front.getsockopt_string(zmq.LAST_ENDPOINT)
        backs: dict[bytes, zmq.Socket[Any]] = {}
        ident_of: dict[zmq.Socket[Any], bytes] = {}
        held: list[tuple[float, zmq.Socket[Any], list[bytes]]] = []
        poller = zmq.Poller()
        poller.register(front, zmq.POLLIN)
        self.ready.set()

        def forward(sock: zmq.Socket[Any], frames: list[bytes]) -> None:
            r = self.rng.random()
            # a frame set may carry a batch of many messages: count the messages it hit
            carried = 1
            if frames[-5:][0] == wire.MESSAGES:
                carried = len(wire.decode(frames[-5:], 1 << 20).records)  # type: ignore[union-attr]
            if r < self.drop:
                self.faults["dropped"] += carried
                return
            if r < self.drop + self.dup:
                self.faults["duplicated"] += carried
                sock.send_multipart(frames)
            elif r < self.drop + self.dup + self.delay:
                self.faults["delayed"] += 1
                held.append((time.monotonic() + self.rng.uniform(0, 0.03), sock, frames))
                return
            sock.send_multipart(frames)

        while not self.stopping.is_set():
            for sock, _ in poller.poll(2):
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if sock is front:
                        ident, rest = frames[0], frames[1:]
                        back = backs.get(ident)
                        if back is None:
                            back = backs[ident] = ctx.socket(zmq.DEALER)
                            back.setsockopt(zmq.LINGER, 0)
                            back.setsockopt(zmq.ROUTING_ID, ident)
                            back.connect(self.backend)
                            ident_of[back] = ident
                            poller.register(back, zmq.POLLIN)
                        forward(back, rest)
                    else:
                        forward(front, [ident_of[sock], *frames])
            now = time.monotonic()
            due = [h for h in held if h[0] <= now]
            if due:
                held[:] = [h for h in held if h[0] > now]
                for _, sock, frames in due:
                    sock.send_multipart(frames)
        for s in [front, *backs.values()]:
            s.close(0)
        ctx.term()


class Forger(threading.Thread):
    """Connects straight to the listener and sends frames that claim to be "primary":
    batches of real-looking bodies, acks of its replies and refusals, with random epochs."""

    def __init__(self, backend: str, channel: bytes, reply_channel: bytes, n: int) -> None:
        super().__init__(daemon=True)
        self.backend, self.channel, self.reply_channel, self.n = backend, channel, reply_channel, n
        self.rng = random.Random(7)
        self.stopping = threading.Event()
        self.sent = 0

    def run(self) -> None:
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.ROUTING_ID, b"mallory")
        s.connect(self.backend)
        rng = self.rng
        while not self.stopping.wait(0.002):
            epoch = rng.getrandbits(64)
            ids = [rng.randint(1, 2 * self.n) for _ in range(5)]
            kind = self.sent % 3
            if kind == 0:
                records = [(i, 0, 0, f"m{rng.randrange(self.n)}".encode()) for i in ids]
                frames = wire.encode_batch(b"primary", self.channel, epoch, records)
            elif kind == 1:
                frames = wire.encode_ack(b"primary", self.reply_channel, epoch, ids)
            else:
                frames = wire.encode_refusal(b"primary", self.reply_channel, epoch, wire.STALE, ids)
            s.send_multipart(frames)
            while True:  # drain the refusals it gets back
                try:
                    s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
            self.sent += 1
        s.close(0)
        ctx.term()


def test_20000_messages_through_a_lossy_device_take_effect_once() -> None:
    n = 20_000
    effects: Counter[str] = Counter()
    replies: Counter[str] = Counter()
    all_replied = threading.Event()

    def slc(m: Incoming) -> None:
        effects[m.text] += 1
        m.reply(m.body)

    def msc(r: Incoming) -> None:
        replies[r.text] += 1
        if len(replies) == n:
            all_replied.set()

    srv = Messenger("replica", retry_initial=0.2, retry_max=1.0).start()
    backend = srv.listen("tcp://127.0.0.1:0", slc)
    proxy = LossyProxy(backend, drop=0.08, dup=0.08, delay=0.05, seed=3)
    proxy.start()
    assert proxy.ready.wait(5)
    cli = Messenger("primary", retry_initial=0.2, retry_max=1.0).start()
    forger = Forger(backend, proxy.endpoint.encode(), f"{backend}#primary".encode(), n)
    forger.start()
    peak_intervals = 0
    try:
        for i in range(n):
            cli.send(proxy.endpoint, f"m{i}", msc)
        deadline = time.monotonic() + 120
        while not all_replied.wait(0.01):
            assert time.monotonic() < deadline, f"only {len(replies)} of {n} replies"
            peak_intervals = max(
                peak_intervals, srv.stats()["seen_intervals"], cli.stats()["seen_intervals"]
            )
        assert cli.wait_idle(20) and srv.wait_idle(20)
        s, c = srv.stats(), cli.stats()
    finally:
        forger.stopping.set()
        forger.join(5)
        cli.close()
        srv.close()
        proxy.stopping.set()
        proxy.join(5)
    expected = {f"m{i}" for i in range(n)}
    # lost = 0, duplicated = 0, unexpected = 0: for the requests and for the replies
    for counts in (effects, replies):
        assert set(counts) == expected
        assert max(counts.values()) == 1
    # the faults happened and were absorbed by retries and duplicate suppression
    assert proxy.faults["dropped"] > 500 and proxy.faults["duplicated"] > 500
    assert s["duplicates"] > 0 and c["duplicates"] > 0
    assert c["retransmits"] > 0 and s["retransmits"] > 0
    # the forged frames arrived and changed nothing (refused, or ignored by epoch)
    assert forger.sent > 100 and s["unknown_epoch"] > 0 and s["refusals_ignored"] > 0
    # duplicate tracking stayed small (a plain set would hold 20,000 ids per side) ...
    assert peak_intervals <= cli.window, peak_intervals
    # ... and is empty once every message arrived: one max_seen per sender and channel
    assert s["seen_intervals"] == 0 and c["seen_intervals"] == 0
    assert s["seen_keys"] == 1 and c["seen_keys"] == 1
    assert c["callbacks"] == 0  # every one-shot MSC was released
