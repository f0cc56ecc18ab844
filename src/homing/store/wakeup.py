"""Waiting for new work the same way on every backend (``Store.wakeup``).

PostgreSQL wakes a waiter by LISTEN/NOTIFY (``NotifyWakeup``); SQLite has no notifications
between processes, so a waiter polls with a back-off (``PollingWakeup``): short right after
work was found, doubling while there is none. The worker, the HTTP dispatcher, sessions
and the engine's blocking take all wait through this one seam.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class PollingWakeup:
    """Sleep ``min_poll``, doubling up to ``max_poll`` while nothing is found."""

    def __init__(self, min_poll: float, max_poll: float, stop: threading.Event | None = None):
        self.min_poll = min_poll
        self.max_poll = max(min_poll, max_poll)
        self._step = min_poll
        self._stop = stop or threading.Event()

    def wait(self, timeout: float) -> bool:
        """Sleep one back-off step (at most ``timeout``); False: nothing announces work here."""
        self._stop.wait(max(0.0, min(timeout, self._step)))
        self._step = min(self.max_poll, self._step * 2)
        return False

    def reset(self) -> None:
        self._step = self.min_poll


class NotifyWakeup:
    """Block on a channel's notifications (``listen(timeout) -> notified``)."""

    def __init__(self, listen: Callable[[float], bool]) -> None:
        self._listen = listen

    def wait(self, timeout: float) -> bool:
        return self._listen(max(0.0, timeout))

    def reset(self) -> None:
        """Nothing to reset: a notification wakes the waiter at once."""
