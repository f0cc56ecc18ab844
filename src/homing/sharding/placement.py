"""Where a unique key lives: rendezvous (highest-random-weight) hashing over shard numbers.

A key's shard is the shard whose hash of (key, shard number) is highest. Shard numbers are
positions in the URL list, so adding a shard means appending its URL: a key then either
stays where it was or moves to the new shard (about 1/(n+1) of the keys move, never between
old shards), which is what makes the migration in docs/jobs.md ("Adding a shard") work.
"""

from __future__ import annotations

from hashlib import blake2b

from homing.errors import ConfigurationError


def _weight(key: str, shard: int) -> int:
    digest = blake2b(f"{shard}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(key: str, shards: int) -> int:
    """The shard of ``key`` among shards ``0 .. shards-1``."""
    return max(range(shards), key=lambda i: (_weight(key, i), -i))


class Placement:
    """Key placement over ``shards`` shards; ``previous`` is the shard count before the
    last shards were added, while keys placed then may still live on their old shard."""

    def __init__(self, shards: int, previous: int | None = None) -> None:
        if previous is not None and (
            isinstance(previous, bool) or not isinstance(previous, int) or not 0 < previous < shards
        ):
            raise ConfigurationError(
                f"previous_shards must be between 1 and {shards - 1} (the shard count before "
                f"the new URLs were appended), got {previous!r}"
            )
        self.shards = shards
        self.previous = previous

    def owner(self, key: str) -> int:
        return owner(key, self.shards)

    def previous_owner(self, key: str) -> int | None:
        """The shard that owned ``key`` before shards were added, if it moved, else None."""
        if self.previous is None:
            return None
        now = self.owner(key)
        return owner(key, self.previous) if now >= self.previous else None
