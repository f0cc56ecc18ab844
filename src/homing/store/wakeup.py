"""Waiting for new work the same way on every backend (``Store.wakeup``).

PostgreSQL wakes a waiter by LISTEN/NOTIFY (``NotifyWakeup``); SQLite has no notifications
between processes, so a waiter polls with a back-off (``PollingWakeup``): short right after
work was found, doubling while there is none. The worker, the HTTP dispatcher, sessions
and the engine's blocking take all wait through this one seam.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any


class PollingWakeup:
    """Sleep ``min_poll``, doubling up to ``max_poll`` while nothing is found; woken at once
    by an announcement made in this process (``LocalNotices``) for its channel and
    ``key`` (or for all)."""

    def __init__(self, min_poll: float, max_poll: float, key: str | None = None) -> None:
        self.min_poll = min_poll
        self.max_poll = max(min_poll, max_poll)
        self.key = key
        self._step = min_poll
        self._poke = threading.Event()
        self._on_close: Callable[[], None] | None = None

    def wait(self, timeout: float) -> bool:
        """Sleep one back-off step (at most ``timeout``); True only if ``interrupt`` woke it."""
        woke = self._poke.wait(max(0.0, min(timeout, self._step)))
        self._poke.clear()
        self._step = min(self.max_poll, self._step * 2)
        return woke

    def reset(self) -> None:
        self._step = self.min_poll

    def interrupt(self) -> None:
        self._poke.set()

    def close(self) -> None:
        if self._on_close is not None:
            self._on_close()
            self._on_close = None


class LocalNotices:
    """Announcements between the threads of one process, for a store without
    notifications (SQLite): a commit that announces work on a channel wakes this
    process's polling waiters of that channel at once (those of its key, or all when
    it has none). Waiters in other processes still find it at their next poll. Held
    weakly: a wake-up nobody closes goes away with its owner."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, weakref.WeakSet[PollingWakeup]] = {}

    def register(self, channel: str, wakeup: PollingWakeup) -> PollingWakeup:
        with self._lock:
            self._waiters.setdefault(channel, weakref.WeakSet()).add(wakeup)

        def forget() -> None:
            with self._lock:
                waiters = self._waiters.get(channel)
                if waiters is not None:
                    waiters.discard(wakeup)
                    if not waiters:
                        del self._waiters[channel]

        wakeup._on_close = forget
        return wakeup

    def announce(self, channel: str, key: str = "") -> None:
        with self._lock:
            waiters = list(self._waiters.get(channel, ()))
        for w in waiters:
            if not key or w.key is None or w.key == key:
                w.interrupt()


class NotifyWakeup:
    """Block on a channel's notifications (``listen(timeout) -> notified``); ``close``
    undoes what the listener registered for this waiter (a key), if anything."""

    def __init__(
        self,
        listen: Callable[[float], bool],
        poke: Callable[[], None],
        close: Callable[[], None] | None = None,
    ) -> None:
        self._listen = listen
        self._poke = poke
        self._close = close

    def wait(self, timeout: float) -> bool:
        return self._listen(max(0.0, timeout))

    def reset(self) -> None:
        """Nothing to reset: a notification wakes the waiter at once."""

    def interrupt(self) -> None:
        self._poke()

    def close(self) -> None:
        if self._close is not None:
            self._close()
            self._close = None


class AnyWakeup:
    """Wakes on any of several wake-ups (a sharded store: one per shard)."""

    def __init__(self, wakeups: list[Any]) -> None:
        self._wakeups = wakeups

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if any(w.wait(0) for w in self._wakeups):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self._wakeups[0].wait(min(0.01, remaining)):
                return True

    def reset(self) -> None:
        for w in self._wakeups:
            w.reset()

    def interrupt(self) -> None:
        for w in self._wakeups:
            w.interrupt()

    def close(self) -> None:
        for w in self._wakeups:
            w.close()


class IdleWakeup:
    """A worker's wake-up that knows its own channel (None where there is none): grabs
    made with ``idle_channel=channel`` register the worker as idle, and an insert wakes as
    many registered workers as it inserted jobs. Between wake-ups it looks anyway after
    ``first`` seconds, doubling up to ``longest``: a registration that raced an insert (its
    job was committed just after the empty grab looked, and the insert did not see the
    registration yet) costs at most that step."""

    def __init__(
        self, channel: str | None, inner: Any, *, first: float = 0.0, longest: float = 0.0
    ) -> None:
        self.channel = channel
        self._inner = inner
        self.first = first
        self.longest = max(first, longest)
        self._step = first

    def wait(self, timeout: float) -> bool:
        if self.first <= 0:
            return bool(self._inner.wait(timeout))
        woke = bool(self._inner.wait(min(timeout, self._step)))
        self._step = self.first if woke else min(self.longest, self._step * 2)
        return woke

    def reset(self) -> None:
        self._step = self.first
        self._inner.reset()

    def interrupt(self) -> None:
        self._inner.interrupt()

    def close(self) -> None:
        self._inner.close()
