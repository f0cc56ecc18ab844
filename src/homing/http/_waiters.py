"""Wake-ups for callers waiting on a message's outcome in this process (the sender's
``wait``); outcomes recorded by other processes are seen by polling the store."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable


class _Waiters:
    """Callbacks of callers waiting for one message's outcome in this process, and which
    of those messages this process saw delivered (a ``send``'s result is nothing more:
    its waiters need not read the row back). Both hold only messages someone waits for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[str, list[Callable[[], None]]] = {}
        self._sent: set[str] = set()

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
                self._sent.discard(msg_id)

    def sent(self, msg_id: str) -> bool:
        """Whether this process recorded the message as a delivered ``send`` (committed)."""
        with self._lock:
            return msg_id in self._sent

    def fire(self, msg_id: str, *, sent: bool = False) -> None:
        with self._lock:
            fns = list(self._by_id.get(msg_id, ()))
            if sent and fns:
                self._sent.add(msg_id)
        for fn in fns:
            try:
                fn()
            except RuntimeError:  # the waiter's event loop closed meanwhile
                pass


#: Wakes the waiters of a message when a dispatcher or reply node in this process records
#: its outcome; waiters also poll the store, for outcomes recorded by other processes.
waiters = _Waiters()


def notify_changed(msg_id: str, *, sent: bool = False) -> None:
    """The message's outcome was committed by this process; ``sent``: it is a ``send``,
    now delivered (its waiters return at once, without reading the row)."""
    waiters.fire(msg_id, sent=sent)


class AsyncWake:
    """A message's wake-up for an asyncio waiter: set by a dispatcher or reply node of
    this process (``waiters``) when it records the message's outcome. Registered when
    made: make it before the message is stored and no outcome is missed."""

    def __init__(self, msg_id: str) -> None:
        self.msg_id = msg_id
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        waiters.add(msg_id, self._fire)

    def _fire(self) -> None:
        self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self, seconds: float) -> None:
        """Until woken or ``seconds`` passed."""
        try:
            await asyncio.wait_for(self._event.wait(), seconds)
        except TimeoutError:
            pass
        self._event.clear()

    def close(self) -> None:
        waiters.remove(self.msg_id, self._fire)
