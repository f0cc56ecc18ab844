"""The queue engine of seed 001, over the store: the public API.

Every operation runs in one store transaction (it joins the caller's if one is open), and
every piece of engine state (queues, selectors with their credits, message entries) is in
the store. A crash anywhere (for example at the failpoint ``engine.mid_route``) rolls the
whole operation back, so the rules hold across process crashes. The rules themselves live
in ``routing``, ``credits``, ``limits``, ``dead_letters`` and ``graph``; this module checks
arguments, opens the transaction and reports.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from homing.database import Database
from homing.engine import codec, credits, graph, limits, routing, rules
from homing.engine.codec import DEAD_LETTERS
from homing.engine.messaging import MAX_BATCH, MAX_LEASE_S, MAX_WAIT_S, Messaging
from homing.engine.model import (
    QueueInfo,
    QueueNotFound,
    SelectorInfo,
    SelectorNotFound,
)
from homing.engine.run import Run
from homing.errors import ConfigurationError, InvalidArgument, InvalidState
from homing.store import engine_queries as q

__all__ = ["DEAD_LETTERS", "MAX_BATCH", "MAX_LEASE_S", "MAX_WAIT_S", "Engine"]

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_HEADERS_BYTES = 64 * 1024
DEFAULT_MAX_HISTORY = 1000
DEFAULT_CONSUMER_TIMEOUT = 60.0
_MODES = ("move", "copy", "bounce")


class Engine(Messaging):
    """Queues and selectors as a directed graph, in a homing store (seed 001).

    ``Engine(db)`` works on a ``homing.Database`` (one store). Calls made inside an open
    ``db.transaction()`` join it, so a consumer's ``ack`` commits together with its own
    writes. ``consumer_timeout`` (s): a consumer that has not called ``take`` for that long
    is absent; messages given to it and not taken within that time go back to the queue.
    """

    def __init__(
        self,
        db: Database,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_headers_bytes: int = DEFAULT_MAX_HEADERS_BYTES,
        consumer_timeout: float = DEFAULT_CONSUMER_TIMEOUT,
    ) -> None:
        if not isinstance(db, Database):
            raise ConfigurationError(
                "the queue engine works on one store (homing.Database); a sharded store is not "
                "supported: connect to a single URL"
            )
        self.db = db
        self.max_body_bytes = int(
            codec.count("max_body_bytes", max_body_bytes, allow_none=False, minimum=1) or 1
        )
        self.max_headers_bytes = int(
            codec.count("max_headers_bytes", max_headers_bytes, allow_none=False, minimum=2) or 2
        )
        self.consumer_timeout = float(
            codec.seconds("consumer_timeout", consumer_timeout, allow_none=False) or 1.0
        )

    @contextmanager
    def _run(self) -> Iterator[Run]:
        with self.db.store.transaction() as tx:
            q.lock_engine(tx)
            run = Run(self, tx)
            yield run
            routing.drain(run)
            run.finish()

    def job_args(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The args of a job made for a message by a job-type selector."""
        args: dict[str, Any] = {
            "message_id": row["id"],
            "seq": int(row["seq"]),
            "queue": row["queue"],
            "headers": json.loads(row["headers"]),
            "address": row["address"],
            "return_address": row["return_address"],
        }
        if row["body_kind"] == "json":
            args["body"] = json.loads(bytes(row["body"]).decode())
        else:
            args["body_base64"] = base64.b64encode(bytes(row["body"])).decode()
        return args

    # -- queues -----------------------------------------------------------------------------
    def create_queue(
        self,
        name: str,
        *,
        dead_letter: str | None = None,
        max_unprocessed: int | None = None,
        on_overflow: str = "discard",
        max_history: int | None = DEFAULT_MAX_HISTORY,
        self_destruct: bool = False,
        max_deliveries: int | None = None,
        message_ttl: float | None = None,
        expires: float | None = None,
        exist_ok: bool = False,
    ) -> QueueInfo:
        """Create a queue. ``on_overflow`` is what happens to a new message when
        ``max_unprocessed`` are waiting: ``discard`` (the default: the new message is
        dead-lettered, or dropped and logged without a dead-letter queue), ``reject`` (the
        publisher gets ``QueueFull``), ``drop-head`` (the oldest waiting message is
        dead-lettered or dropped) or ``overflow`` (the overflow selector takes it).
        ``max_history`` processed messages are kept (oldest dropped first; None keeps all).
        ``max_deliveries``: takes without ack before a message is dead-lettered.
        ``message_ttl`` (s): how long a message may wait. ``expires`` (s): the queue deletes
        itself after that long without selectors or publishes. A ``self_destruct`` queue
        deletes itself when its last selector is deleted."""
        codec.name("queue name", name)
        if dead_letter is not None:
            codec.name("dead_letter", dead_letter, reserved_ok=True)
            if dead_letter == name:
                raise InvalidArgument(f"queue {name!r} cannot be its own dead-letter queue")
        if on_overflow not in limits.OVERFLOW_ACTIONS:
            raise InvalidArgument(
                f"on_overflow must be one of {', '.join(limits.OVERFLOW_ACTIONS)}, "
                f"got {on_overflow!r}"
            )
        if not isinstance(self_destruct, bool):
            raise InvalidArgument(f"self_destruct must be true or false, got {self_destruct!r}")
        settings = {
            "dead_letter": dead_letter,
            "max_unprocessed": codec.count("max_unprocessed", max_unprocessed),
            "on_overflow": on_overflow,
            "max_history": codec.count("max_history", max_history),
            "self_destruct": self_destruct,
            "max_deliveries": codec.count("max_deliveries", max_deliveries, minimum=1),
            "message_ttl": codec.seconds("message_ttl", message_ttl),
            "expires": codec.seconds("expires", expires),
        }
        with self._run() as run:
            existing = q.get_queue(run.tx, name)
            if existing is not None:
                same = all(
                    (bool(existing[k]) if k == "self_destruct" else existing[k]) == v
                    for k, v in settings.items()
                )
                if exist_ok and same:
                    return codec.queue_info(existing)
                raise InvalidState(
                    f"queue {name!r} exists already"
                    + ("" if same else " with other settings")
                    + "; delete it first or pick another name"
                )
            if dead_letter is not None and q.get_queue(run.tx, dead_letter) is None:
                raise QueueNotFound(
                    f"dead-letter queue {dead_letter!r} does not exist; create it first"
                )
            q.insert_queue(run.tx, name=name, now=run.now, **settings)  # type: ignore[arg-type]
            row = q.get_queue(run.tx, name)
            assert row is not None
            return codec.queue_info(row)

    def delete_queue(self, name: str, *, force: bool = False) -> None:
        """Delete a queue. Without ``force`` it must be empty and unused (no selectors, no
        unprocessed or outstanding messages, nothing routing to it, no queue using it as
        its dead-letter queue). With ``force`` its selectors return their messages, held
        messages are bounced or dead-lettered, selectors of other queues that feed it are
        deleted, and queues that used it as their dead-letter queue lose that link."""
        codec.name("queue name", name)
        with self._run() as run:
            row = q.get_queue(run.tx, name)
            if row is None:
                raise QueueNotFound(f"no queue {name!r}; `homing queues list` shows the queues")
            if not force:
                busy = _in_use(run, name)
                if busy:
                    raise InvalidState(
                        f"queue {name!r} is in use ({'; '.join(busy)}); unbind and drain it, "
                        "or delete with force=True"
                    )
            graph.destroy_queue(run, name)

    def queue(self, name: str) -> QueueInfo:
        """One queue with its depths."""
        for info in self.queues():
            if info.name == name:
                return info
        raise QueueNotFound(f"no queue {name!r}")

    def queues(self) -> list[QueueInfo]:
        """Every queue (the engine's dead-letter queue ``$dead`` too) with its depths."""
        with self.db.store.transaction(write=False) as tx:
            return [codec.queue_info(r) for r in q.list_queues(tx)]

    # -- selectors --------------------------------------------------------------------------
    def bind(
        self,
        queue: str,
        name: str,
        *,
        to: str | None = None,
        consumer: str | None = None,
        job_type: str | None = None,
        mode: str = "move",
        match: Mapping[str, Any] | None = None,
        credits: int = 1,
        role: str = "normal",
    ) -> SelectorInfo:
        """Attach a selector ``name`` to ``queue``.

        Destination: another queue (``to``), an external consumer that takes messages with
        ``take`` (``consumer``), or a job type (``job_type``: each message becomes a job,
        inserted in the same transaction; ``settle_jobs`` pays when the job ends). A
        ``bounce`` selector has no destination: it moves the message to its return address.
        ``mode`` is move (credit flow control; ``credits`` to start with), copy (no credits)
        or bounce. ``role`` is normal, ``default`` (used when no normal selector matches;
        its match rule is ignored) or ``overflow`` (used when the queue is full).
        """
        codec.name("queue name", queue, reserved_ok=True)
        codec.name("selector name", name)
        dest_kind, dest = _destination(mode, role, to, consumer, job_type)
        rule = rules.validate(match)
        n = 0 if mode == "copy" else int(codec.count("credits", credits, allow_none=False) or 0)
        with self._run() as run:
            if q.get_queue(run.tx, queue) is None:
                raise QueueNotFound(f"no queue {queue!r}; create it first")
            if q.get_selector(run.tx, queue, name) is not None:
                raise InvalidState(
                    f"queue {queue!r} has a selector {name!r} already; unbind it first"
                )
            if role != "normal" and any(s["role"] == role for s in q.selectors_of(run.tx, queue)):
                raise InvalidState(
                    f"queue {queue!r} has a {role} selector already; unbind it first"
                )
            if dest_kind == "queue":
                assert dest is not None
                if q.get_queue(run.tx, dest) is None:
                    raise QueueNotFound(
                        f"destination queue {dest!r} does not exist; create it first"
                    )
                graph.check_acyclic(q.queue_edges(run.tx), queue, dest)
            sid = q.insert_selector(
                run.tx,
                queue=queue,
                name=name,
                mode=mode,
                role=role,
                match_rule=json.dumps(rule, sort_keys=True),
                dest_kind=dest_kind,
                dest=dest,
                credits=n,
                now=run.now,
            )
            run.forget()
            run.work.append(("pump-all", queue))
            row = q.selector_by_id(run.tx, sid)
            assert row is not None
            return codec.selector_info(row)

    def unbind(self, queue: str, name: str) -> list[int]:
        """Delete a selector. Its outstanding messages return to ``queue`` and are routed
        again (to other selectors, the default, the dead-letter queue, or held); returns
        their sequence numbers. A self-destructive queue left without selectors is deleted."""
        codec.name("queue name", queue, reserved_ok=True)
        with self._run() as run:
            sel = q.get_selector(run.tx, queue, name)
            if sel is None:
                raise SelectorNotFound(f"queue {queue!r} has no selector {name!r}")
            returned = credits.remove_selector(run, sel)
            graph.after_selector_removed(run, queue)
            return returned

    def selectors(self, queue: str | None = None) -> list[SelectorInfo]:
        with self.db.store.transaction(write=False) as tx:
            rows = q.all_selectors(tx) if queue is None else q.selectors_of(tx, queue)
            return [codec.selector_info(r) for r in rows]

    def grant(self, queue: str, name: str, credits: int) -> SelectorInfo:
        """Give a MOVE/BOUNCE selector more credits (trust for more unpaid messages)."""
        n = int(codec.count("credits", credits, allow_none=False, minimum=1) or 1)
        with self._run() as run:
            sel = q.get_selector(run.tx, queue, name)
            if sel is None:
                raise SelectorNotFound(f"queue {queue!r} has no selector {name!r}")
            if not codec.uses_credit(sel):
                raise InvalidState(f"selector {queue}/{name} copies; COPY uses no credits")
            run.refund(int(sel["id"]), n, grant=True)
            run.work.append(("pump", queue))
            run.flush()
            row = q.selector_by_id(run.tx, int(sel["id"]))
            assert row is not None
            return codec.selector_info(row)


# -- helpers of the API ------------------------------------------------------------------
def _destination(
    mode: str, role: str, to: str | None, consumer: str | None, job_type: str | None
) -> tuple[str, str | None]:
    if mode not in _MODES:
        raise InvalidArgument(f"mode must be one of {', '.join(_MODES)}, got {mode!r}")
    if role not in ("normal", "default", "overflow"):
        raise InvalidArgument(f"role must be normal, default or overflow, got {role!r}")
    given = [
        (k, v)
        for k, v in (("queue", to), ("consumer", consumer), ("job", job_type))
        if v is not None
    ]
    if mode == "bounce":
        if given:
            raise InvalidArgument(
                "a bounce selector sends messages to their return address; give it no "
                "to=, consumer= or job_type="
            )
        return "bounce", None
    if len(given) != 1:
        raise InvalidArgument(
            "give a selector exactly one destination: to=QUEUE, consumer=NAME or job_type=TYPE"
        )
    dest_kind, dest = given[0]
    if dest_kind == "queue":
        codec.name("destination queue", dest, reserved_ok=True)
    elif dest_kind == "consumer":
        codec.name("consumer name", dest)
    else:
        from homing.jobs import check_type

        check_type(dest)
    return dest_kind, dest


def _in_use(run: Run, name: str) -> list[str]:
    """Why queue ``name`` cannot be deleted without force (empty if it can)."""
    busy = []
    if q.selectors_of(run.tx, name):
        busy.append("it has selectors")
    if q.count(run.tx, name, "ready") or q.count(run.tx, name, "outstanding"):
        busy.append("it holds unprocessed or outstanding messages")
    feeders = q.selectors_targeting(run.tx, name)
    if feeders:
        busy.append(
            "selectors route to it: " + ", ".join(f"{s['queue']}/{s['name']}" for s in feeders)
        )
    users = q.dead_letter_users(run.tx, name)
    if users:
        busy.append("it is the dead-letter queue of " + ", ".join(users))
    return busy
