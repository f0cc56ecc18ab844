"""Schema of the http component (none yet)."""

from __future__ import annotations

from homing.store.migrations import Migration

MIGRATIONS: list[Migration] = []
