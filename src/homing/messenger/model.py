"""Types shared by the messenger's parts: routes, callbacks, failures, dead letters, errors."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from homing.errors import HomingError, InvalidArgument
from homing.messenger import wire

if TYPE_CHECKING:
    from homing.database import Transaction
    from homing.messenger.core import Messenger

NOOP = 0
"""The built-in callback id for messages that expect no reply (seed: BuiltinCallback::NOOP)."""

NAMED_BIT = 1 << 62
MAX_CB = (1 << 63) - 1


class MessengerError(HomingError):
    """The messenger cannot do what was asked (see the message for what to change)."""


class MessengerFenced(MessengerError):
    """Another live process with this messenger's name took over a channel (its receiver
    granted it a newer epoch); this process may no longer send there."""


class Route:
    """Where a message goes: a DEALER to ``destination``, or back through a listener's
    ROUTER to the peer named ``peer``. Hashable, compared by ``key`` (not ``via``)."""

    __slots__ = ("destination", "key", "kind", "peer", "via")

    def __init__(self, kind: str, destination: str, peer: bytes = b"", via: bytes = b"") -> None:
        self.kind, self.destination, self.peer = kind, destination, peer
        self.key = (kind, destination, peer)
        # the routing id a received frame came from: answers to that frame (ack, refusal,
        # grant) go back there; new messages to the peer go to its latest routing id
        self.via = via

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Route) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"Route{self.key!r}"


@dataclass(frozen=True)
class Curve:
    """CurveZMQ settings: this messenger's certificate and whom it trusts.

    ``secret_key_file``: a ``.key_secret`` file made by ``zmq.auth.create_certificates``
    (it holds the public key too). ``authorized_keys_dir``: listeners accept only clients
    whose public ``.key`` file is in this directory, and a client's messenger name must be the
    file's stem (``primary.key`` may only send as ``primary``: the ZAP User-Id binds the name
    to the key). None: any client that speaks CURVE (encrypted, names not authenticated).
    ``server_public_keys``: destination -> the server's public ``.key`` file.
    """

    secret_key_file: str | Path
    authorized_keys_dir: str | Path | None = None
    server_public_keys: Mapping[str, str | Path] = field(default_factory=dict)


class Incoming:
    """A message handed to a callback. ``tx`` is the open transaction in durable mode
    (``tx.connection`` for your own SQL, or the job API): your writes commit together with
    the message being marked seen. ``reply`` answers it (the sender's MSC receives it)."""

    __slots__ = (
        "_messenger", "_route", "body", "channel", "dest_cb", "message_id", "sender",
        "source_cb", "tx",
    )  # fmt: skip
    failed = False

    def __init__(
        self,
        messenger: Messenger,
        route: Route,
        sender: str,
        channel: str,
        record: wire.Record,
        tx: Transaction | None,
    ) -> None:
        self._messenger = messenger
        self._route = route
        self.sender, self.channel = sender, channel
        self.message_id, self.source_cb, self.dest_cb, self.body = record
        self.tx = tx

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    @property
    def endpoint(self) -> str:
        """The listen endpoint it arrived on, or the destination a reply came back from."""
        return self._route.destination

    def reply(self, message: bytes | str, callback: Callback | str | int = NOOP) -> None:
        """Send ``message`` back to the sender's callback; ``callback`` gets the answer to it."""
        self._messenger._send(self._route, message, callback, self.source_cb)

    def __repr__(self) -> str:
        return (
            f"<Incoming {self.sender}/{self.channel}#{self.message_id} "
            f"cb {self.source_cb}->{self.dest_cb} {len(self.body)}B>"
        )


@dataclass(frozen=True)
class Failure:
    """Handed to a message's MSC instead of a reply when the messenger gave up on it
    (``failed`` is True; an ``Incoming`` has ``failed`` False). ``reason`` says why:
    ``ttl`` (its deadline passed), ``attempts`` (max_attempts transmissions without an ack)
    or ``fenced`` (another process with this name took the channel over). The message is
    kept as a dead letter: ``Messenger.dead_letters()`` lists it, ``redrive`` sends it again."""

    destination: str
    channel: str
    message_id: int
    body: bytes
    reason: str
    attempts: int
    failed: bool = True

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")


@dataclass(frozen=True)
class DeadLetter:
    """A message the messenger gave up on. ``direction`` is ``out`` (never acknowledged by
    the receiver) or ``in`` (received, but its callback raised ``max_handler_attempts``
    times: parked, acknowledged, not applied). ``redrive`` sends/applies it again with its
    original id, so a copy that was in fact delivered is still suppressed as a duplicate."""

    direction: str
    peer: str
    channel: str
    message_id: int
    source_cb: int
    dest_cb: int
    body: bytes
    reason: str
    attempts: int
    failed_at: float
    callback_name: str | None = None
    route: tuple[str, str, str] = ("", "", "")  # kind, destination, peer (hex)


Callback = Callable[[Any], None]


def check_name(name: str, what: str) -> bytes:
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{what} must be a non-empty string, got {name!r}")
    raw = name.encode("utf-8")
    if len(raw) > wire.MAX_NAME_BYTES or raw[0] == 0:
        raise InvalidArgument(
            f"{what} {name!r} must be 1..{wire.MAX_NAME_BYTES} UTF-8 bytes and not start with NUL"
        )
    return raw


def check_endpoint(endpoint: str) -> str:
    if not isinstance(endpoint, str) or not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
        raise InvalidArgument(
            f"endpoint {endpoint!r} is not supported; use tcp://host:port, ipc:///path or "
            "inproc://name"
        )
    check_name(endpoint, "endpoint")
    return endpoint


def check_positive(what: str, value: Any, *, integer: bool = False, optional: bool = False) -> None:
    """A clear InvalidArgument unless ``value`` is a positive number (``None`` if optional)."""
    if optional and value is None:
        return
    kinds = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0:
        kind = "integer" if integer else "number"
        raise InvalidArgument(f"{what} must be a positive {kind}, got {value!r}")


def check_numbers(numbers: Mapping[str, Any], integers: Mapping[str, Any]) -> None:
    """Every value of ``numbers`` a positive number, of ``integers`` a positive integer."""
    for what, value in numbers.items():
        check_positive(what, value)
    for what, value in integers.items():
        check_positive(what, value, integer=True)
