"""The messenger's wire format: seed 003's ``id-source_cb-dest_cb-contents`` as frames.

A message is one ZeroMQ multipart message of 8 frames::

    [b"HM1M", sender, channel, incarnation, message_id, source_cb, dest_cb, contents]

an acknowledgement (of one or more ids of one channel) is::

    [b"HM1A", acker, channel, incarnation, ids]

and a connecting messenger greets the listener with ``[b"HM1H", sender]`` each time its
connection is (re)established, so the listener retransmits what waits for it at once.

``sender``/``acker`` and ``channel`` are UTF-8 text (at most 255 bytes); the integers are
8 bytes big-endian; ``ids`` is a packed array of such integers. A ROUTER socket adds the
peer's routing id in front. Anything else is garbage: ``decode`` raises ``FrameError``
and the I/O loop logs and drops it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from homing.errors import InvalidArgument

MESSAGE = b"HM1M"
ACK = b"HM1A"
HELLO = b"HM1H"
MAX_NAME_BYTES = 255
_U64 = struct.Struct(">Q")
MAX_U64 = (1 << 64) - 1


class FrameError(InvalidArgument):
    """A received ZeroMQ message is not in the messenger's format; it was dropped."""


@dataclass(frozen=True, slots=True)
class Message:
    sender: str
    channel: str
    incarnation: int
    message_id: int
    source_cb: int
    dest_cb: int
    body: bytes


@dataclass(frozen=True, slots=True)
class Ack:
    acker: str
    channel: str
    incarnation: int
    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Hello:
    sender: str


def encode_hello(sender: bytes) -> list[bytes]:
    return [HELLO, sender]


def u64(value: int) -> bytes:
    return _U64.pack(value)


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


def encode_message(
    sender: bytes,
    channel: bytes,
    incarnation: int,
    message_id: int,
    source_cb: int,
    dest_cb: int,
    body: bytes,
) -> list[bytes]:
    return [
        MESSAGE,
        sender,
        channel,
        _U64.pack(incarnation),
        _U64.pack(message_id),
        _U64.pack(source_cb),
        _U64.pack(dest_cb),
        body,
    ]


def encode_ack(acker: bytes, channel: bytes, incarnation: int, ids: list[int]) -> list[bytes]:
    return [ACK, acker, channel, _U64.pack(incarnation), struct.pack(f">{len(ids)}Q", *ids)]


def decode(frames: list[bytes], max_body: int) -> Message | Ack | Hello:
    """Parse one received multipart message (without a ROUTER's identity frame)."""
    if not frames:
        raise FrameError("empty multipart message")
    kind = frames[0]
    if kind == MESSAGE:
        if len(frames) != 8:
            raise FrameError(f"message has {len(frames)} frames, expected 8 (truncated?)")
        body = frames[7]
        if len(body) > max_body:
            raise FrameError(f"message body of {len(body)} bytes is over the limit of {max_body}")
        message_id = _int(frames[4], "message id")
        if message_id == 0:
            raise FrameError("message id 0 is not valid (ids start at 1)")
        return Message(
            _text(frames[1], "sender"),
            _text(frames[2], "channel"),
            _int(frames[3], "incarnation"),
            message_id,
            _int(frames[5], "source callback"),
            _int(frames[6], "destination callback"),
            body,
        )
    if kind == ACK:
        if len(frames) != 5:
            raise FrameError(f"ack has {len(frames)} frames, expected 5 (truncated?)")
        packed = frames[4]
        if not packed or len(packed) % 8 or len(packed) > 8 * 65536:
            raise FrameError(f"ack id list of {len(packed)} bytes is not 1..65536 ids")
        ids = struct.unpack(f">{len(packed) // 8}Q", packed)
        return Ack(
            _text(frames[1], "acker"),
            _text(frames[2], "channel"),
            _int(frames[3], "incarnation"),
            ids,
        )
    if kind == HELLO:
        if len(frames) != 2:
            raise FrameError(f"hello has {len(frames)} frames, expected 2")
        return Hello(_text(frames[1], "sender"))
    raise FrameError(f"unknown frame kind {bytes(kind[:16])!r}; expected {MESSAGE!r} or {ACK!r}")
