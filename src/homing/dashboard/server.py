"""Run the dashboard: in the foreground (``homing dashboard``) or in a background thread
(``homing pipeline run --dashboard``), with the access rules checked first."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from typing import Any

from homing.dashboard.app import Access, create_app
from homing.errors import ConfigurationError


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_access(host: str, access: Access, insecure: bool) -> None:
    """Refuse to put an unauthenticated dashboard on the network unless told to."""
    if not is_loopback(host) and not access.protected and not insecure:
        raise ConfigurationError(
            f"refusing to serve the dashboard on {host} without authentication: give --token "
            "or --basic USER:PASSWORD (or --insecure-no-auth if a proxy in front of it checks)"
        )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class BackgroundDashboard:
    """A uvicorn server for the dashboard in a daemon thread; ``stop()`` ends it."""

    def __init__(
        self, db: Any, *, host: str = "127.0.0.1", port: int = 0, access: Access | None = None
    ) -> None:
        import uvicorn

        self.db = db
        self.host = host
        self.port = port or free_port(host)
        config = uvicorn.Config(
            create_app(db, access=access),
            host=host,
            port=self.port,
            log_level="warning",
            lifespan="off",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="homing-dashboard", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def start(self, timeout: float = 10.0) -> BackgroundDashboard:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise ConfigurationError(
                    f"the dashboard could not start on {self.host}:{self.port}"
                )
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
