"""The store tests' own fixture: a migrated ``Store`` with a scratch table ``contract_t``
(``k`` text key, ``v`` integer), on both backends, and a reader of that table."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from homing.store import open_store
from homing.store.protocol import Store


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url)
    s.migrate()
    with s.transaction() as tx:
        tx.execute("CREATE TABLE contract_t (k TEXT PRIMARY KEY, v INTEGER NOT NULL)")
    yield s
    s.close()


def rows(store: Store) -> dict[str, int]:
    """``contract_t`` as a dict, read in a transaction of its own."""
    with store.transaction(write=False) as tx:
        return {str(k): int(v) for k, v in tx.query("SELECT k, v FROM contract_t")}
