"""The messenger's API, threading, transports, bad input and CurveZMQ (in-memory mode)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq
import zmq.auth

from homing.errors import ConfigurationError, InvalidArgument, PayloadTooLarge
from homing.messenger import NOOP, Curve, Incoming, Messenger, MessengerError, wire


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:  # type: ignore[type-arg]
    context = zmq.Context()
    yield context
    context.destroy(linger=0)  # a failed assertion may leave a socket open


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


@pytest.mark.parametrize("transport", ["tcp", "ipc", "inproc"])
def test_reply_runs_the_message_specific_callback(ctx, tmp_path: Path, transport: str) -> None:  # type: ignore[no-untyped-def]
    endpoint = {
        "tcp": "tcp://127.0.0.1:0",
        "ipc": f"ipc://{tmp_path}/m.sock",
        "inproc": "inproc://reply-test",
    }[transport]
    replies: dict[int, bytes] = {}
    with Messenger("srv", context=ctx) as srv, Messenger("cli", context=ctx) as cli:
        bound = srv.listen(endpoint, lambda m: m.reply(m.body.upper()))
        for i in range(50):
            cli.send(bound, f"hello {i}", lambda r, i=i: replies.__setitem__(i, r.body))
        cli.send(bound, b"no answer expected", NOOP)
        wait_for(lambda: len(replies) == 50)
        assert cli.wait_idle(5) and srv.wait_idle(5)
        assert replies == {i: f"HELLO {i}".encode() for i in range(50)}
        stats = cli.stats()
        # the NOOP conversation's reply found no callback id: none registered, none left
        assert stats["callbacks"] == 0 and stats["unacknowledged"] == 0


def test_msc_runs_before_slc_and_conversations_continue(ctx) -> None:  # type: ignore[no-untyped-def]
    order: list[str] = []
    done = threading.Event()

    def server_loop(m: Incoming) -> None:
        order.append(f"slc:{m.text}")
        if m.text == "hi":
            m.reply("who?", lambda r: order.append(f"msc:{r.text}"))

    def client_msc(r: Incoming) -> None:
        order.append(f"client-msc:{r.text}")
        r.reply("me")  # continues the conversation: goes to the server's MSC, then its SLC
        done.set()

    with Messenger("srv", context=ctx) as srv, Messenger("cli", context=ctx) as cli:
        srv.listen("inproc://conv", server_loop)
        cli.send("inproc://conv", "hi", client_msc)
        assert done.wait(5)
        wait_for(lambda: len(order) == 4)
    assert order == ["slc:hi", "client-msc:who?", "msc:me", "slc:me"]


def test_send_returns_at_once_and_from_many_threads(ctx) -> None:  # type: ignore[no-untyped-def]
    got: list[str] = []
    lock = threading.Lock()

    def slc(m: Incoming) -> None:
        with lock:
            got.append(m.text)

    with Messenger("cli", context=ctx) as cli:
        # nobody listens yet: send must not block, and reports no "sent" state
        t0 = time.perf_counter()
        assert cli.send("inproc://late", "early") is None
        assert time.perf_counter() - t0 < 0.5

        def producer(k: int) -> None:
            for i in range(300):
                cli.send("inproc://late", f"{k}-{i}")

        threads = [threading.Thread(target=producer, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with Messenger("srv", context=ctx, retry_initial=0.05) as srv:
            srv.listen("inproc://late", slc)
            assert cli.wait_idle(20) and srv.wait_idle(20)
    expected = ["early"] + [f"{k}-{i}" for k in range(8) for i in range(300)]
    assert sorted(got) == sorted(expected)


def test_a_slow_callback_does_not_stall_the_loop(ctx) -> None:  # type: ignore[no-untyped-def]
    release = threading.Event()
    fast: list[str] = []
    with Messenger("srv", context=ctx, workers=4) as srv:

        def slc(m: Incoming) -> None:
            if m.text == "slow":
                release.wait(10)
            else:
                fast.append(m.text)

        srv.listen("inproc://slow", slc)
        # pick a second sender whose (sender, channel) maps to another worker
        names = [f"fast{i}" for i in range(50)]
        slow_worker = hash(("slow-sender", "inproc://slow")) % 4
        other = next(n for n in names if hash((n, "inproc://slow")) % 4 != slow_worker)
        with (
            Messenger("slow-sender", context=ctx) as a,
            Messenger(other, context=ctx) as b,
        ):
            a.send("inproc://slow", "slow")
            time.sleep(0.05)
            for i in range(20):
                b.send("inproc://slow", f"f{i}")
            wait_for(lambda: len(fast) == 20, 5)
            assert b.wait_idle(5)  # acks flowed while the slow callback still ran
            assert a.unacknowledged() == 1
            release.set()
            assert a.wait_idle(5)


def test_a_raising_callback_is_retried_not_lost(ctx, caplog) -> None:  # type: ignore[no-untyped-def]
    effects: list[str] = []
    failures = {"n": 0}

    def slc(m: Incoming) -> None:
        if m.text == "flaky" and failures["n"] < 2:
            failures["n"] += 1
            raise RuntimeError("transient")
        effects.append(m.text)

    caplog.set_level(logging.CRITICAL, logger="homing.messenger")
    with (
        Messenger("srv", context=ctx) as srv,
        Messenger("cli", context=ctx, retry_initial=0.05) as cli,
    ):
        srv.listen("inproc://flaky", slc)
        for text in ("a", "flaky", "b"):
            cli.send("inproc://flaky", text)
        assert cli.wait_idle(10) and srv.wait_idle(10)
        assert srv.stats()["handler_errors"] == 2
    assert sorted(effects) == ["a", "b", "flaky"]


def _epoch(srv: Messenger, sender: str, channel: str) -> int:
    """The epoch the receiver granted to a sender channel (from its workers' state)."""
    for w in srv._workers:
        st = w.states.get((sender, channel))
        if st is not None:
            return st.epoch
    raise AssertionError(f"no state for {sender}/{channel}")


def test_restarted_sender_gets_a_new_epoch_and_old_frames_are_refused(ctx) -> None:  # type: ignore[no-untyped-def]
    """A restarted in-memory sender numbers from 1 again under a new epoch granted by the
    receiver; a late frame of the old epoch is refused (STALE), never acknowledged."""
    got: list[str] = []
    with Messenger("srv", context=ctx) as srv:
        srv.listen("inproc://inc", lambda m: got.append(m.text))
        with Messenger("snd", context=ctx) as first:
            for i in range(5):
                first.send("inproc://inc", f"old{i}")
            assert first.wait_idle(5)
        old_epoch = _epoch(srv, "snd", "inproc://inc")
        with Messenger("snd", context=ctx) as second:
            for i in range(5):
                second.send("inproc://inc", f"new{i}")
            assert second.wait_idle(5)
        assert _epoch(srv, "snd", "inproc://inc") == old_epoch + 1
        # a delayed retransmission of the first session's id 3 shows up
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.RCVTIMEO, 5000)
        raw.setsockopt(zmq.ROUTING_ID, b"snd")
        raw.connect("inproc://inc")
        channel = b"inproc://inc"
        raw.send_multipart(wire.encode_message(b"snd", channel, old_epoch, 3, 0, 0, b"old3"))
        refusal = wire.decode(raw.recv_multipart(), 1000)  # refused, and not delivered
        assert isinstance(refusal, wire.Refusal)
        assert (refusal.reason, refusal.ranges) == (wire.STALE, [(3, 3)])
        raw.close(0)
        wait_for(lambda: srv.stats()["stale"] == 1)
        assert srv.stats()["delivered"] == 10
    assert got == [f"old{i}" for i in range(5)] + [f"new{i}" for i in range(5)]


def _session(raw: zmq.Socket, sender: bytes, channel: bytes, fresh: bool = True) -> int:  # type: ignore[type-arg]
    """Ask the listener for an epoch the way a messenger does; returns the granted epoch."""
    raw.send_multipart(wire.encode_epoch_request(sender, channel, 77, 1, fresh))
    grant = wire.decode(raw.recv_multipart(), 1000)
    assert isinstance(grant, wire.EpochGrant) and grant.nonce == 77
    return grant.epoch


def test_bad_input_is_logged_and_dropped_and_the_loop_keeps_serving(ctx, caplog) -> None:  # type: ignore[no-untyped-def]
    got: list[str] = []
    caplog.set_level(logging.WARNING, logger="homing.messenger")
    with Messenger("srv", context=ctx, max_message_bytes=1000) as srv:
        srv.listen("inproc://bad", lambda m: got.append(m.text))
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.RCVTIMEO, 5000)
        raw.setsockopt(zmq.ROUTING_ID, b"raw")
        raw.connect("inproc://bad")
        epoch = _session(raw, b"raw", b"c")
        good = wire.encode_message(b"raw", b"c", epoch, 1, 0, 0, b"ok")
        garbage: list[list[bytes]] = [
            [b"\x00\xffgarbage"],  # unknown kind
            [b""],  # one empty frame
            good[:4],  # truncated multipart
            [*good, b"extra"],  # too many frames
            [wire.MESSAGES, b"", b"c", *good[3:]],  # empty sender
            [wire.MESSAGES, b"\xff\xfe", b"c", *good[3:]],  # sender not UTF-8
            [*good[:3], b"\x01", good[4]],  # epoch frame of 1 byte
            [*good[:4], good[4][:-1]],  # record body truncated
            [*good[:4], good[4][:20]],  # record header truncated
            [*good[:4], b""],  # a batch of no message
            wire.encode_message(b"raw", b"c", epoch, 0, 0, 0, b"zero id"),
            wire.encode_message(b"raw", b"c", epoch, 2, 0, 0, b"x" * 1001),  # oversize body
            wire.encode_message(b"raw", b"c", epoch, 3, 0, (1 << 64) - 1, b"huge cb"),
            [wire.ACK, b"raw", b"c", b"\x00" * 8, b"\x01\x02\x03"],  # ranges not 16-aligned
            [wire.ACK, b"raw", b"c"],  # truncated ack
            [wire.ACK, b"raw", b"c", b"\x00" * 8, wire.u64(0) + wire.u64(5)],  # range from 0
            [wire.REFUSE, b"raw", b"c", b"\x00" * 8, b"\x09", wire.u64(1) * 2],  # bad reason
            [wire.EPOCH_REQUEST, b"raw", b"c", wire.u64(1), wire.u64(0), b"\x01"],  # low id 0
        ]
        for frames in garbage:
            raw.send_multipart(frames)
        wait_for(lambda: srv.stats()["dropped_frames"] == len(garbage))
        # a peer speaking wire version 1 gets a clear refusal
        raw.send_multipart([b"HM1M", b"raw", b"c", *[wire.u64(1)] * 4, b"old"])
        refusal = raw.recv_multipart()
        assert refusal[0] == wire.VERSION_REFUSAL and b"version 1" in refusal[2]
        assert srv.stats()["old_peers_refused"] == 1
        # a well-formed message for an unknown callback id: logged, dropped, acknowledged
        raw.send_multipart(wire.encode_message(b"raw", b"c", epoch, 4, 0, 777, b"who is 777?"))
        assert raw.recv_multipart()[0] == wire.ACK
        assert srv.stats()["unknown_callbacks"] == 1
        # an ack for nothing we sent is ignored
        raw.send_multipart(wire.encode_ack(b"raw", b"c", 1, [1, 2, 3]))
        # still serving: a good message is delivered and acknowledged
        raw.send_multipart(wire.encode_message(b"raw", b"c", epoch, 5, 0, 0, b"ok"))
        ack = wire.decode(raw.recv_multipart(), 1000)
        assert isinstance(ack, wire.Ack) and ack.ids == (5,)
        raw.close(0)
    assert got == ["ok"]
    assert "unknown callback id 777" in caplog.text
    assert "truncated" in caplog.text


def test_bad_arguments_raise_clear_errors(ctx) -> None:  # type: ignore[no-untyped-def]
    with Messenger("m", context=ctx, max_message_bytes=10) as m:
        with pytest.raises(PayloadTooLarge, match="max_message_bytes"):
            m.send("inproc://x", b"x" * 11)
        with pytest.raises(InvalidArgument, match="not supported"):
            m.send("udp://x", b"x")
        with pytest.raises(InvalidArgument, match="register_callback"):
            m.send("inproc://x", b"x", "nobody")
        with pytest.raises(InvalidArgument, match="bytes or str"):
            m.send("inproc://x", 42)  # type: ignore[arg-type]
        m.listen("inproc://taken", lambda _: None)
        with pytest.raises(MessengerError, match="already listening"):
            m.listen("inproc://taken", lambda _: None)
    with pytest.raises(ConfigurationError, match="name="):
        Messenger(db=object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        Messenger("\x00bad")
    with pytest.raises(MessengerError, match="closed"):
        m.send("inproc://x", b"x")


def test_listen_on_a_taken_tcp_port_says_so(ctx) -> None:  # type: ignore[no-untyped-def]
    with Messenger("a", context=ctx) as a, Messenger("b", context=ctx) as b:
        bound = a.listen("tcp://127.0.0.1:0", lambda _: None)
        with pytest.raises(MessengerError, match="cannot listen"):
            b.listen(bound, lambda _: None)


def test_curve_authenticates_and_encrypts(ctx, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    keys, allowed = tmp_path / "keys", tmp_path / "allowed"
    keys.mkdir()
    allowed.mkdir()
    server_pub, server_sec = zmq.auth.create_certificates(keys, "server")
    client_pub, client_sec = zmq.auth.create_certificates(keys, "client")
    _, intruder_sec = zmq.auth.create_certificates(keys, "intruder")
    (allowed / "client.key").write_bytes(Path(client_pub).read_bytes())
    got: list[str] = []
    with Messenger("srv", context=ctx, curve=Curve(server_sec, authorized_keys_dir=allowed)) as srv:
        ep = srv.listen("tcp://127.0.0.1:0", lambda m: got.append(f"{m.sender}:{m.text}"))
        server_keys = {ep: server_pub}
        with (
            Messenger(
                "client", context=ctx, curve=Curve(client_sec, server_public_keys=server_keys)
            ) as good,
            Messenger(
                "intruder", context=ctx, curve=Curve(intruder_sec, server_public_keys=server_keys)
            ) as bad,
            Messenger("plain", context=ctx) as plain,
        ):
            bad.send(ep, "let me in")
            plain.send(ep, "no crypto")
            good.send(ep, "hello")
            assert good.wait_idle(5)
            time.sleep(0.3)
            assert bad.unacknowledged() == 1 and plain.unacknowledged() == 1
            with pytest.raises(ConfigurationError, match="server public key"):
                good.send("tcp://127.0.0.1:1", "x")
    assert got == ["client:hello"]
    with pytest.raises(ConfigurationError, match="secret key"):
        Messenger("x", context=ctx, curve=Curve(server_pub))


def test_a_returning_peer_gets_its_replies_at_once(ctx) -> None:  # type: ignore[no-untyped-def]
    """A reply whose peer went away is retried with growing backoff; when a messenger of
    that name connects again, its hello makes the listener retransmit at once instead of
    waiting out the backoff (here the next timer is at least 0.9 s away)."""
    arrived, left, replied = threading.Event(), threading.Event(), threading.Event()

    def slc(m: Incoming) -> None:
        arrived.set()
        left.wait(5)  # the sender has gone
        m.reply("late answer", lambda _r: None)
        replied.set()

    with Messenger("srv", context=ctx, retry_initial=0.5, retry_max=60.0) as srv:
        endpoint = srv.listen("tcp://127.0.0.1:0", slc)
        with Messenger("cli", context=ctx) as first:
            first.send(endpoint, "question", lambda _r: None)
            assert arrived.wait(5)
        left.set()
        assert replied.wait(5)
        time.sleep(1.9)  # retransmissions at ~0.5 s and ~1.5 s; the next at >= 2.8 s
        assert srv.unacknowledged() == 1
        with Messenger("cli", context=ctx) as again:
            t0 = time.monotonic()
            again.connect(endpoint)
            assert srv.wait_idle(5)
            assert time.monotonic() - t0 < 0.6
            # the new incarnation has no such callback: logged, dropped, acknowledged
            wait_for(lambda: again.stats()["unknown_callbacks"] == 1)


def test_cli_echo_and_send(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"tcp://127.0.0.1:{port}"
    homing_cmd = [sys.executable, "-m", "homing", "messenger"]
    server = subprocess.Popen(
        [*homing_cmd, "echo", "--listen", endpoint, "--quiet"], stderr=subprocess.PIPE, text=True
    )
    try:
        assert server.stderr is not None
        assert "listening" in server.stderr.readline()
        out = subprocess.run(
            [*homing_cmd, "send", endpoint, "hello", "world"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        assert sorted(out.stdout.split()) == ["hello", "world"]
    finally:
        server.terminate()
        server.wait(10)
    out = subprocess.run(
        [*homing_cmd, "send", endpoint, "anyone?", "--timeout", "0.5"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1 and "did not arrive" in out.stderr
    assert "Traceback" not in out.stderr
