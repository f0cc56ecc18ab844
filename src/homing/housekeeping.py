"""``homing gc``: one pass that cleans every table of a store that grows with traffic.

Each step deletes what is past its retention and returns how many rows it deleted:

==================  ==========================================  =========================
step                what it deletes                              default retention
==================  ==========================================  =========================
jobs                finished jobs (done / failed)               the store's retention (7
                                                                 days unless connect() says)
sessions.requests   requests whose reply was taken, no longer   30 days after the take
                    remembered by their session
sessions.expired    sessions idle longer than the session TTL,  30 days without a client
                    with their prepared requests, unanswered    action, or the TTL their
                    requests and untaken replies                opener set if longer
engine.published    the engine's published-id ledger (publisher 7 days after publishing
                    dedup: a retry after this is a new message)
http.tombstones     finished outbox rows (sender tombstones)    7 days; inbox ids longer
                    and handled inbox ids (receiver tombstones) while a receiver's
                                                                promised retention binds
messenger.*         durable messenger rows idle that long: seen  7 days, longer while a
                    state of silent senders, dead letters,      running messenger's
                    unused outgoing channels                    promise binds
promises            retention promises that cover no row any    (retention_queries)
                    more
==================  ==========================================  =========================

Steps call the query functions of each part in ``homing.store`` (no SQL here) and run in
short transactions of their own, so a long clean-up never holds a lock for long. Another
part adds its own step with ``register`` (the messenger's seen and channel rows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from homing.database import Database
from homing.errors import InvalidArgument
from homing.jobs import check_seconds
from homing.store import (
    engine_queries,
    http_queries,
    messenger_queries,
    retention_queries,
    sessions_queries,
)

DAY = 24 * 3600.0
SESSIONS_RETENTION_S = 30 * DAY  # homing.sessions' DEFAULT_RETENTION_S
SESSION_TTL_S = 30 * DAY  # homing.sessions' DEFAULT_SESSION_TTL_S
ENGINE_PUBLISHED_RETENTION_S = 7 * DAY
HTTP_RETENTION_S = 7 * DAY  # homing.http's Receiver default retention
MESSENGER_RETENTION_S = 7 * DAY  # homing.messenger.durable's DEFAULT_RETENTION_S
_EXPIRE_BATCH = 1000


@dataclass(frozen=True)
class Retention:
    """Seconds each kind of row is kept (see the module docstring for what each means)."""

    jobs: float | None = None  # None: the store's own (homing.connect(retention=...))
    sessions: float = SESSIONS_RETENTION_S
    session_ttl: float = SESSION_TTL_S
    engine_published: float = ENGINE_PUBLISHED_RETENTION_S
    http: float = HTTP_RETENTION_S
    messenger: float = MESSENGER_RETENTION_S

    def __post_init__(self) -> None:
        if self.jobs is not None:
            check_seconds("jobs", self.jobs, allow_zero=True)
        for name in ("sessions", "engine_published", "http", "messenger"):
            check_seconds(name, getattr(self, name), allow_zero=True)
        check_seconds("session_ttl", self.session_ttl, allow_zero=False)


Step = Callable[[Database, Retention], dict[str, int]]


@dataclass
class Housekeeping:
    """The clean-up steps run by ``homing gc``; ``register`` adds one."""

    steps: dict[str, Step] = field(default_factory=dict)

    def register(self, name: str, step: Step) -> None:
        if not name or name in self.steps:
            raise InvalidArgument(f"a gc step needs a new name, got {name!r}")
        self.steps[name] = step

    def run(self, db: Database, retention: Retention | None = None) -> dict[str, int]:
        """Run every step; returns rows deleted per table (or per kind of row)."""
        keep = retention or Retention()
        deleted: dict[str, int] = {}
        for step in self.steps.values():
            deleted.update(step(db, keep))
        return deleted


def _jobs(db: Database, keep: Retention) -> dict[str, int]:
    return {"jobs": db.gc(older_than=keep.jobs)}


def _sessions(db: Database, keep: Retention) -> dict[str, int]:
    now = db.clock.now()
    with db.store.transaction() as tx:
        taken = sessions_queries.gc(tx, taken_before=now - keep.sessions)
    expired = 0
    while True:
        with db.store.transaction() as tx:
            n = sessions_queries.expire_sessions(
                tx, idle_before=now - keep.session_ttl, now=now, limit=_EXPIRE_BATCH
            )
        expired += n
        if n < _EXPIRE_BATCH:
            break
    return {"sessions.requests": taken, "sessions.expired": expired}


def _engine(db: Database, keep: Retention) -> dict[str, int]:
    with db.store.transaction() as tx:
        n = engine_queries.forget_published(tx, before=db.clock.now() - keep.engine_published)
    return {"engine.published": n}


def _http(db: Database, keep: Retention) -> dict[str, int]:
    with db.store.transaction() as tx:
        now = db.clock.now()
        outbox, inbox = http_queries.gc(tx, before=now - keep.http, now=now)
    return {"http.outbox": outbox, "http.inbox": inbox}


def _messenger(db: Database, keep: Retention) -> dict[str, int]:
    now = db.clock.now()
    with db.store.transaction() as tx:
        deleted = messenger_queries.collect_garbage(tx, now - keep.messenger, now=now)
    return {f"messenger.{kind}": n for kind, n in deleted.items()}


def _promises(db: Database, keep: Retention) -> dict[str, int]:
    with db.store.transaction() as tx:
        return {"promises": retention_queries.forget_unbinding(tx, now=db.clock.now())}


def default_housekeeping() -> Housekeeping:
    """The steps of every part that ships with homing (one store, not a sharded list)."""
    h = Housekeeping()
    h.register("jobs", _jobs)
    h.register("sessions", _sessions)
    h.register("engine", _engine)
    h.register("http", _http)
    h.register("messenger", _messenger)
    h.register("promises", _promises)
    return h


def collect(db: Database, retention: Retention | None = None) -> dict[str, int]:
    """One ``homing gc`` pass over ``db``: rows deleted per table (or kind of row)."""
    return default_housekeeping().run(db, retention)
