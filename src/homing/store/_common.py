"""Pieces shared by the backends: URL parsing and the per-context transaction slot."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import parse_qsl, urlsplit

from homing.errors import ConfigurationError
from homing.store.protocol import Tx


def split_url(url: str) -> tuple[str, str, dict[str, str]]:
    """Return (scheme, rest-without-query, query options) of a store URL."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            f"not a store URL: {url!r}; use sqlite:///path/to/file.db or "
            "postgresql://user@host:5432/dbname"
        )
    parts = urlsplit(url)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    rest = url.split("?", 1)[0]
    return parts.scheme.lower(), rest, options


def parse_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"option {name}={value!r} must be true or false")


class TxSlot:
    """Remembers the transaction open in this thread or asyncio task, so inner calls join it."""

    def __init__(self, name: str) -> None:
        self._var: contextvars.ContextVar[Tx | None] = contextvars.ContextVar(name, default=None)

    def get(self) -> Tx | None:
        return self._var.get()

    @contextmanager
    def bind(self, tx: Tx) -> Iterator[Tx]:
        token = self._var.set(tx)
        try:
            yield tx
        finally:
            self._var.reset(token)
