"""The messenger's wire format, version 2: seed 003's ``id-source_cb-dest_cb-contents`` as the
logical fields, many messages packed into one ZeroMQ message.

Every ZeroMQ message starts with a 4-byte kind whose third byte is the version (``HM2?``):

- messages:   ``[HM2M, sender, channel, epoch, records]``; ``records`` is a concatenation of
  ``message_id, source_cb, dest_cb`` (8 bytes each), ``body length`` (4 bytes), ``body``;
- ack:        ``[HM2A, acker, channel, epoch, ranges]``; ``ranges`` packs inclusive
  ``(lo, hi)`` id ranges (8 + 8 bytes each);
- refusal:    ``[HM2R, refuser, channel, epoch, reason, ranges]``: these ids were NOT
  delivered; ``reason`` is one byte (``STALE``: a newer epoch exists, the sender is fenced;
  ``UNKNOWN``: the receiver does not know this epoch, ask for one again);
- epoch request ``[HM2E, sender, channel, nonce, low, fresh]`` and grant
  ``[HM2G, granter, channel, nonce, epoch]``: the receiver assigns a sender's epoch (the
  sender never picks it), so a restarted sender or a forged frame cannot move it;
- hello ``[HM2H, sender]`` (a connection was (re)established), ping ``[HM2P, sender]`` and
  pong ``[HM2Q, sender]`` (liveness of a peer that went quiet).

Names are UTF-8 text (1..255 bytes); integers are big-endian. A ROUTER socket adds the peer's
routing id in front. A version-1 frame (``HM1?``) raises ``OldVersion``; anything else that
does not parse raises ``FrameError``; the I/O loop logs, counts and drops it.
"""

from __future__ import annotations

import struct

from homing.errors import InvalidArgument

MESSAGES = b"HM2M"
ACK = b"HM2A"
REFUSE = b"HM2R"
EPOCH_REQUEST = b"HM2E"
EPOCH_GRANT = b"HM2G"
HELLO = b"HM2H"
PING = b"HM2P"
PONG = b"HM2Q"
VERSION_REFUSAL = b"HM2V"
OLD_PREFIX = b"HM1"

STALE = 1
UNKNOWN = 2
REASONS = {STALE: "stale epoch (a newer session of this sender exists)", UNKNOWN: "unknown epoch"}

MAX_NAME_BYTES = 255
MAX_RECORDS = 65536
MAX_RANGES = 65536
MAX_U64 = (1 << 64) - 1
_U64 = struct.Struct(">Q")
_REC = struct.Struct(">QQQI")
_RANGE = struct.Struct(">QQ")

Record = tuple[int, int, int, bytes]
"""One message inside a batch: (message_id, source_cb, dest_cb, body)."""


class FrameError(InvalidArgument):
    """A received ZeroMQ message is not in the messenger's format; it was dropped."""


class OldVersion(FrameError):
    """The peer speaks wire version 1; it gets a version refusal and must be upgraded."""


class Batch:
    __slots__ = ("channel", "epoch", "records", "sender")

    def __init__(self, sender: str, channel: str, epoch: int, records: list[Record]) -> None:
        self.sender, self.channel, self.epoch, self.records = sender, channel, epoch, records


class Ack:
    __slots__ = ("acker", "channel", "epoch", "ranges")

    def __init__(self, acker: str, channel: str, epoch: int, ranges: list[tuple[int, int]]):
        self.acker, self.channel, self.epoch, self.ranges = acker, channel, epoch, ranges

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(i for lo, hi in self.ranges for i in range(lo, hi + 1))


class Refusal:
    __slots__ = ("channel", "epoch", "ranges", "reason", "refuser")

    def __init__(
        self, refuser: str, channel: str, epoch: int, reason: int, ranges: list[tuple[int, int]]
    ) -> None:
        self.refuser, self.channel, self.epoch = refuser, channel, epoch
        self.reason, self.ranges = reason, ranges


class EpochRequest:
    __slots__ = ("channel", "fresh", "low", "nonce", "sender")

    def __init__(self, sender: str, channel: str, nonce: int, low: int, fresh: bool) -> None:
        self.sender, self.channel, self.nonce, self.low, self.fresh = (
            sender, channel, nonce, low, fresh,
        )  # fmt: skip


class EpochGrant:
    __slots__ = ("channel", "epoch", "granter", "nonce")

    def __init__(self, granter: str, channel: str, nonce: int, epoch: int) -> None:
        self.granter, self.channel, self.nonce, self.epoch = granter, channel, nonce, epoch


class Signal:
    """hello, ping or pong: only says that ``sender`` is there."""

    __slots__ = ("kind", "sender")

    def __init__(self, kind: bytes, sender: str) -> None:
        self.kind, self.sender = kind, sender


Decoded = Batch | Ack | Refusal | EpochRequest | EpochGrant | Signal


def u64(value: int) -> bytes:
    return _U64.pack(value)


MAX_RANGE_SPAN = 1 << 20


def ranges_of(ids: list[int]) -> list[tuple[int, int]]:
    """Sorted inclusive ranges covering ``ids`` (an acknowledgement of 256 ids in a row is
    one range); no range spans more than ``MAX_RANGE_SPAN`` ids."""
    out: list[tuple[int, int]] = []
    for i in sorted(set(ids)):
        if out and out[-1][1] == i - 1 and i - out[-1][0] < MAX_RANGE_SPAN:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def _chunks(ranges: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    return [ranges[i : i + MAX_RANGES] for i in range(0, len(ranges), MAX_RANGES)]


def encode_records(records: list[Record]) -> bytes:
    pack = _REC.pack
    return b"".join(pack(i, s, d, len(b)) + b for i, s, d, b in records)


def encode_batch(sender: bytes, channel: bytes, epoch: int, records: list[Record]) -> list[bytes]:
    return [MESSAGES, sender, channel, _U64.pack(epoch), encode_records(records)]


def encode_message(
    sender: bytes, channel: bytes, epoch: int, message_id: int, source_cb: int, dest_cb: int,
    body: bytes,
) -> list[bytes]:  # fmt: skip
    """One message as a batch of one (tests and tools)."""
    return encode_batch(sender, channel, epoch, [(message_id, source_cb, dest_cb, body)])


def _pack_ranges(ranges: list[tuple[int, int]]) -> bytes:
    return b"".join(_RANGE.pack(lo, hi) for lo, hi in ranges)


def encode_ack(acker: bytes, channel: bytes, epoch: int, ids: list[int]) -> list[bytes]:
    return [ACK, acker, channel, _U64.pack(epoch), _pack_ranges(ranges_of(ids))]


def encode_acks(acker: bytes, channel: bytes, epoch: int, ids: list[int]) -> list[list[bytes]]:
    """Acks for any number of ids: as many ZeroMQ messages as the range limit needs."""
    e = _U64.pack(epoch)
    return [[ACK, acker, channel, e, _pack_ranges(c)] for c in _chunks(ranges_of(ids))]


def encode_refusals(
    refuser: bytes, channel: bytes, epoch: int, reason: int, ids: list[int]
) -> list[list[bytes]]:
    e, r = _U64.pack(epoch), bytes([reason])
    return [[REFUSE, refuser, channel, e, r, _pack_ranges(c)] for c in _chunks(ranges_of(ids))]


def encode_refusal(
    refuser: bytes, channel: bytes, epoch: int, reason: int, ids: list[int]
) -> list[bytes]:
    return [
        REFUSE, refuser, channel, _U64.pack(epoch), bytes([reason]),
        _pack_ranges(ranges_of(ids)),
    ]  # fmt: skip


def encode_epoch_request(
    sender: bytes, channel: bytes, nonce: int, low: int, fresh: bool
) -> list[bytes]:
    return [
        EPOCH_REQUEST, sender, channel, _U64.pack(nonce), _U64.pack(low), b"\x01" if fresh else b"\0"
    ]  # fmt: skip


def encode_epoch_grant(granter: bytes, channel: bytes, nonce: int, epoch: int) -> list[bytes]:
    return [EPOCH_GRANT, granter, channel, _U64.pack(nonce), _U64.pack(epoch)]


def encode_signal(kind: bytes, sender: bytes) -> list[bytes]:
    return [kind, sender]


def encode_hello(sender: bytes) -> list[bytes]:
    return [HELLO, sender]


def _int(frame: bytes, what: str) -> int:
    if len(frame) != 8:
        raise FrameError(f"{what} frame has {len(frame)} bytes, expected 8")
    return int(_U64.unpack(frame)[0])


def _text(frame: bytes, what: str) -> str:
    if not frame or len(frame) > MAX_NAME_BYTES:
        raise FrameError(f"{what} frame has {len(frame)} bytes, expected 1..{MAX_NAME_BYTES}")
    try:
        return frame.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FrameError(f"{what} frame is not UTF-8") from exc


def _ranges(packed: bytes) -> list[tuple[int, int]]:
    if not packed or len(packed) % 16 or len(packed) > 16 * MAX_RANGES:
        raise FrameError(f"id range list of {len(packed)} bytes is not 1..{MAX_RANGES} ranges")
    out = [(int(lo), int(hi)) for lo, hi in _RANGE.iter_unpack(packed)]
    for lo, hi in out:
        if not 1 <= lo <= hi or hi - lo >= MAX_RANGE_SPAN:
            raise FrameError(f"id range [{lo}, {hi}] is empty, starts at 0 or is too long")
    return out


def _records(packed: bytes, max_body: int) -> list[Record]:
    out: list[Record] = []
    n, pos, unpack = len(packed), 0, _REC.unpack_from
    while pos < n:
        if pos + 28 > n:
            raise FrameError("message record header is truncated")
        message_id, source_cb, dest_cb, size = unpack(packed, pos)
        pos += 28
        if size > max_body:
            raise FrameError(f"message body of {size} bytes is over the limit of {max_body}")
        if pos + size > n:
            raise FrameError("message body is truncated")
        if message_id == 0:
            raise FrameError("message id 0 is not valid (ids start at 1)")
        out.append((message_id, source_cb, dest_cb, packed[pos : pos + size]))
        pos += size
        if len(out) > MAX_RECORDS:
            raise FrameError(f"a batch holds more than {MAX_RECORDS} messages")
    if not out:
        raise FrameError("a batch holds no message")
    return out


_SIZES = {MESSAGES: 5, ACK: 5, REFUSE: 6, EPOCH_REQUEST: 6, EPOCH_GRANT: 5}


def decode(frames: list[bytes], max_body: int) -> Decoded:
    """Parse one received multipart message (without a ROUTER's identity frame)."""
    if not frames:
        raise FrameError("empty multipart message")
    kind = bytes(frames[0])
    want = _SIZES.get(kind)
    if want is not None and len(frames) != want:
        raise FrameError(f"{kind!r} has {len(frames)} frames, expected {want} (truncated?)")
    if kind == MESSAGES:
        return Batch(
            _text(frames[1], "sender"), _text(frames[2], "channel"), _int(frames[3], "epoch"),
            _records(frames[4], max_body),
        )  # fmt: skip
    if kind == ACK:
        return Ack(
            _text(frames[1], "acker"), _text(frames[2], "channel"), _int(frames[3], "epoch"),
            _ranges(frames[4]),
        )  # fmt: skip
    if kind == REFUSE:
        reason = frames[4][0] if len(frames[4]) == 1 else 0
        if reason not in REASONS:
            raise FrameError(f"refusal reason {bytes(frames[4][:8])!r} is unknown")
        return Refusal(
            _text(frames[1], "refuser"), _text(frames[2], "channel"), _int(frames[3], "epoch"),
            reason, _ranges(frames[5]),
        )  # fmt: skip
    if kind == EPOCH_REQUEST:
        low = _int(frames[4], "low id")
        if low == 0 or frames[5] not in (b"\0", b"\x01"):
            raise FrameError("epoch request has low id 0 or a bad fresh flag")
        return EpochRequest(
            _text(frames[1], "sender"), _text(frames[2], "channel"), _int(frames[3], "nonce"),
            low, frames[5] == b"\x01",
        )  # fmt: skip
    if kind == EPOCH_GRANT:
        return EpochGrant(
            _text(frames[1], "granter"), _text(frames[2], "channel"), _int(frames[3], "nonce"),
            _int(frames[4], "epoch"),
        )  # fmt: skip
    if kind in (HELLO, PING, PONG):
        if len(frames) != 2:
            raise FrameError(f"{kind!r} has {len(frames)} frames, expected 2")
        return Signal(kind, _text(frames[1], "sender"))
    if kind.startswith(OLD_PREFIX):
        raise OldVersion(
            f"peer speaks messenger wire version 1 ({kind!r}); this messenger speaks version 2: "
            "upgrade the peer"
        )
    if kind == VERSION_REFUSAL:
        raise FrameError(f"the peer refused our wire version: {bytes(frames[-1][:200])!r}")
    raise FrameError(f"unknown frame kind {kind[:16]!r}; expected one of HM2M/A/R/E/G/H/P/Q")
