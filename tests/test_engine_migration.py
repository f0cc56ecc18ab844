"""Engine schema version 2 applies over version 1 with data in it, on both backends."""

from __future__ import annotations

import pytest

import homing
from homing.engine import Engine, QueueFull
from homing.store.migrations.engine import MIGRATIONS

TABLES = ("homing_engine_published", "homing_engine_entries", "homing_engine_selectors")


def test_version_2_over_version_1_keeps_queues_and_messages(store_url: str) -> None:
    db = homing.connect(store_url)
    assert isinstance(db, homing.Database)
    with db.store.transaction() as tx:  # back to engine version 1, with data
        for table in (*TABLES, "homing_engine_queues"):
            tx.execute(f"DROP TABLE {table}")
        tx.execute("DELETE FROM homing_migrations WHERE component = 'engine'")
        v1 = MIGRATIONS[0]
        for stmt in v1.postgres if tx.dialect == "postgres" else v1.sqlite:
            tx.execute(stmt)
        tx.execute(
            "INSERT INTO homing_migrations (component, version, name, applied_at) "
            "VALUES ('engine', 1, 'engine', 0)"
        )
        tx.execute(
            "INSERT INTO homing_engine_queues (name, max_unprocessed, on_overflow, created_at) "
            "VALUES ('old', 2, 'reject', 0)"
        )
        tx.execute(
            "INSERT INTO homing_engine_entries (id, queue, state, headers, body, body_kind, "
            "address, created_at) VALUES (?, 'old', 'ready', '{}', ?, 'json', 'old', 0)",
            (homing.uuid7(), b'"kept"'),
        )
    db.close()

    db = homing.connect(store_url)  # applies engine version 2
    assert isinstance(db, homing.Database)
    try:
        engine = Engine(db)
        info = engine.queue("old")
        assert (info.on_overflow, info.max_unprocessed, info.ready) == ("reject", 2, 1)
        assert [m.body for m in engine.messages("old")] == ["kept"]
        assert engine.messages("old")[0].deaths == []
        engine.publish("old", "new")
        with pytest.raises(QueueFull):
            engine.publish("old", "one too many")
        engine.create_queue("dh", on_overflow="drop-head", max_unprocessed=1)
        engine.bind("old", "c", consumer="c", credits=5)
        assert sorted(d.body for d in engine.take("c", limit=5)) == ["kept", "new"]
        assert engine.check() == []
    finally:
        db.close()
