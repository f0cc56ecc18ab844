"""A sharded store: several PostgreSQL databases behind one job API (seed 002)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import homing
from homing import ConfigurationError, JobNotFound
from tests.conftest import StoreFactory


@pytest.fixture
def sharded(tmp_path: Path) -> Iterator[homing.ShardedDatabase]:
    """Sharding is a PostgreSQL feature: three fresh schemas stand for three databases."""
    factory = StoreFactory("postgres", tmp_path)
    db = homing.connect([factory.url(f"shard{i}") for i in range(3)])
    assert isinstance(db, homing.ShardedDatabase)
    yield db
    db.close()
    factory.cleanup()


def test_sqlite_shards_are_refused(tmp_path: Path) -> None:
    urls = [f"sqlite:///{tmp_path}/a.db", f"sqlite:///{tmp_path}/b.db"]
    with pytest.raises(ConfigurationError, match="shards must be PostgreSQL"):
        homing.connect(urls)


def test_inserts_spread_and_handles_name_their_shard(sharded: homing.ShardedDatabase) -> None:
    handles = [sharded.insert("t", {"i": i}) for i in range(30)]
    shards = Counter(h.split(":")[0] for h in handles)
    assert shards == {"0": 10, "1": 10, "2": 10}
    for h in handles[:5]:
        assert sharded.details(h).handle == h


def test_unique_key_lands_on_one_shard(sharded: homing.ShardedDatabase) -> None:
    first = sharded.insert("t", 1, unique_key="order-9")
    assert all(sharded.insert("t", 1, unique_key="order-9") == first for _ in range(5))
    many = sharded.insert_many([homing.JobSpec("t", 2, unique_key="order-9"), ("t", 3)])
    assert many[0] == first


def test_grabs_visit_shards_fairly(sharded: homing.ShardedDatabase) -> None:
    sharded.insert_many([("t", i) for i in range(60)])
    taken = [sharded.grab("t", lock_for=30) for _ in range(30)]
    by_shard = Counter(j.handle.split(":")[0] for j in taken if j)
    assert sorted(by_shard.values()) == [10, 10, 10]
    for j in taken:
        assert j is not None
        sharded.complete(j)
    assert sum(r["done"] for r in sharded.stats()) == 30


def test_grab_finds_jobs_on_any_shard(sharded: homing.ShardedDatabase) -> None:
    only = sharded.shards[2].insert("rare", None)
    for _ in range(3):  # whatever shard the rotation starts at
        job = sharded.grab("rare", lock_for=5)
        if job is not None:
            break
    assert job is not None and job.handle == only
    sharded.complete(job)


def test_replace_keeps_children_on_the_parent_shard(sharded: homing.ShardedDatabase) -> None:
    parent = sharded.insert("p", None)
    job = sharded.grab("p", lock_for=5)
    assert job is not None
    kids = sharded.replace(job, [("c", i) for i in range(7)])
    assert {k.split(":")[0] for k in kids} == {parent.split(":")[0]}
    assert sharded.details(parent).state == "done"


def test_foreign_and_malformed_handles(sharded: homing.ShardedDatabase) -> None:
    h = sharded.insert("t", None)
    job_id = h.split(":", 1)[1]
    with pytest.raises(JobNotFound, match="names shard 7"):
        sharded.details(f"7:{job_id}")
    with pytest.raises(JobNotFound, match="sharded job handle"):
        sharded.details(job_id)
    with pytest.raises(JobNotFound):
        sharded.shards[0].details(f"1:{job_id}")
    with pytest.raises(homing.InvalidArgument, match="shard must be"):
        sharded.transaction(shard=5)


def test_transaction_on_a_chosen_shard(sharded: homing.ShardedDatabase) -> None:
    with sharded.transaction(shard=1) as tx:
        h = tx.insert("t", None)
    assert h.startswith("1:")
