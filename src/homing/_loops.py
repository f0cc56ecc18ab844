"""The asyncio event loop homing's own threads and servers run on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's loop when installed (uvicorn picks it too: less CPU per request and
    connection), else asyncio's own."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        return asyncio.new_event_loop
    return uvloop.new_event_loop
