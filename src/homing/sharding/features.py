"""Cancel, pause, limits, schedules and dependencies (issue 16) on a sharded store.

A job's cancel goes to its shard; pause and resume write every shard; limits are refused
(each shard would count only its own jobs); schedules and controls are read from shard 0;
waiting jobs are released shard by shard.
"""

from __future__ import annotations

from typing import Any, Protocol

from homing.database import Database
from homing.errors import ConfigurationError


class _Shards(Protocol):
    shards: list[Database]

    def _call(self, index: int, fn: Any, *args: Any, **kwargs: Any) -> Any: ...

    def _index_of(self, handle: Any) -> int: ...

    def _each_live(self, fn: Any, *args: Any, **kwargs: Any) -> list[Any]: ...


class ShardedJobFeatures:
    """Mixed into ``ShardedDatabase``."""

    def cancel(self: _Shards, handle: str, message: str | None = None) -> str:
        return str(self._call(self._index_of(handle), Database.cancel, handle, message))

    def cancel_children(self: _Shards, handle: str, message: str | None = None) -> list[str]:
        """Children live on their parent's shard: one transaction there."""
        return list(self._call(self._index_of(handle), Database.cancel_children, handle, message))

    def pause(self: _Shards, type: str) -> None:
        """Paused on every shard (each shard's grabbers honour it within a second); a shard
        that is down is refused (``StoreUnreachable``): pause again when it is back."""
        for index in range(len(self.shards)):
            self._call(index, Database.pause, type)

    def resume(self: _Shards, type: str) -> None:
        for index in range(len(self.shards)):
            self._call(index, Database.resume, type)

    def limit(self: _Shards, type: str, **limits: Any) -> Any:
        """Refused: a limit is enforced inside one store (its count and its lock), and
        shards do not share them, so no global limit can hold across shards."""
        raise ConfigurationError(
            "limits (max_running, rate, per_key) cannot be enforced across the shards of a "
            "sharded store: each shard counts only its own jobs. Put limited job types on "
            "one store (homing.connect(url)), or divide the limit among the shards yourself "
            "with shard.limit() on each of db.shards"
        )

    def controls(self: _Shards) -> list[Any]:
        """Shard 0's controls (pause and resume write every shard)."""
        return list(self._call(0, Database.controls))

    def schedules(self: _Shards) -> list[dict[str, Any]]:
        """Periodic schedules live on shard 0 (see docs/jobs.md)."""
        return list(self._call(0, Database.schedules))

    def release_waiting(self: _Shards) -> tuple[list[str], list[str]]:
        released: list[str] = []
        cancelled: list[str] = []
        for r, c in self._each_live(Database.release_waiting):
            released += r
            cancelled += c
        return released, cancelled
