"""Failpoints: named places on commit paths where tests inject crashes (after fail-rs).

Configure with ``HOMING_FAILPOINTS="name=ACTION;other=ACTION"`` where ACTION is
``[N*]crash``, ``[N*]raise``, ``[N*]sleep(MS)``, ``[N*]pause`` or ``P%ACTION``:
``3*crash`` fires on the 3rd hit only, ``10%raise`` fires with probability 0.1.
``crash`` sends SIGKILL to the own process (no finally, no atexit), ``pause`` SIGSTOP.
Unset, a failpoint is one dict lookup.
"""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from dataclasses import dataclass

_ACTION = re.compile(
    r"^(?:(?P<nth>\d+)\*|(?P<pct>\d+(?:\.\d+)?)%)?(?P<kind>crash|raise|pause|sleep\((?P<ms>\d+)\))$"
)


class FailpointError(RuntimeError):
    """Raised by a failpoint configured with ``raise``."""


@dataclass
class _Point:
    kind: str
    nth: int | None
    probability: float | None
    sleep_ms: int
    hits: int = 0


_points: dict[str, _Point] = {}
_lock = threading.Lock()


def configure(spec: str | None) -> None:
    """(Re)load the failpoint configuration from a spec string; empty or None clears it."""
    parsed: dict[str, _Point] = {}
    for item in (spec or "").split(";"):
        item = item.strip()
        if not item:
            continue
        name, _, action = item.partition("=")
        m = _ACTION.match(action.strip())
        if not name or not m:
            raise ValueError(
                f"bad failpoint {item!r}: expected NAME=[N*|P%]crash|raise|pause|sleep(MS)"
            )
        kind = m.group("kind").split("(")[0]
        parsed[name.strip()] = _Point(
            kind=kind,
            nth=int(m.group("nth")) if m.group("nth") else None,
            probability=float(m.group("pct")) / 100 if m.group("pct") else None,
            sleep_ms=int(m.group("ms") or 0),
        )
    with _lock:
        _points.clear()
        _points.update(parsed)


def failpoint(name: str) -> None:
    """Fire the failpoint ``name`` if it is configured; otherwise do nothing."""
    if not _points:
        return
    point = _points.get(name)
    if point is None:
        return
    with _lock:
        point.hits += 1
        hits = point.hits
    if point.nth is not None and hits != point.nth:
        return
    if point.probability is not None and random.random() >= point.probability:
        return
    if point.kind == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    elif point.kind == "pause":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif point.kind == "sleep":
        time.sleep(point.sleep_ms / 1000)
    elif point.kind == "raise":
        raise FailpointError(f"failpoint {name} fired (hit {hits})")


configure(os.environ.get("HOMING_FAILPOINTS"))
