"""Wake-ups for callers waiting on a message's outcome in this process (the sender's
``wait``); outcomes recorded by other processes are seen by polling the store."""

from __future__ import annotations

import threading
from collections.abc import Callable


class _Waiters:
    """Callbacks of callers waiting for one message's outcome in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[str, list[Callable[[], None]]] = {}

    def add(self, msg_id: str, fn: Callable[[], None]) -> None:
        with self._lock:
            self._by_id.setdefault(msg_id, []).append(fn)

    def remove(self, msg_id: str, fn: Callable[[], None]) -> None:
        with self._lock:
            fns = self._by_id.get(msg_id, [])
            if fn in fns:
                fns.remove(fn)
            if not fns:
                self._by_id.pop(msg_id, None)

    def fire(self, msg_id: str) -> None:
        with self._lock:
            fns = list(self._by_id.get(msg_id, ()))
        for fn in fns:
            try:
                fn()
            except RuntimeError:  # the waiter's event loop closed meanwhile
                pass


#: Wakes the waiters of a message when a dispatcher or reply node in this process records
#: its outcome; waiters also poll the store, for outcomes recorded by other processes.
waiters = _Waiters()


def notify_changed(msg_id: str) -> None:
    waiters.fire(msg_id)
