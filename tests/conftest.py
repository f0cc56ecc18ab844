"""Fixtures shared by every test: one parametrized store fixture over SQLite and PostgreSQL.

PostgreSQL comes from ``HOMING_TEST_POSTGRES`` or the local server on 127.0.0.1:5432
(database ``test``). Each test gets a fresh schema there and a fresh file for SQLite. With
``CI=true`` an unreachable PostgreSQL fails the run; elsewhere, if PostgreSQL's binaries are
installed, a throwaway server is started in a temporary directory; only without them are the
PostgreSQL tests skipped, with a message that says how to run them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import homing

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
_pg_state: dict[str, str | None] = {}


def _reachable(url: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_throwaway_postgres() -> str | None:
    bindirs = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    initdb = shutil.which("initdb") or next(
        (str(b / "initdb") for b in bindirs if (b / "initdb").exists()), None
    )
    if initdb is None:
        return None
    bindir = Path(initdb).parent
    data = Path(tempfile.mkdtemp(prefix="homing-pg-"))
    port = _free_port()
    user = ["-U", "postgres"]
    run = subprocess.run
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root; use the postgres account
        shutil.chown(data, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    run(
        [*as_user, str(bindir / "initdb"), "-D", str(data), "-A", "trust", *user],
        check=True,
        capture_output=True,
    )
    run(
        [
            *as_user,
            str(bindir / "pg_ctl"),
            "-D",
            str(data),
            "-o",
            f"-p {port} -k {data} -h 127.0.0.1",
            "-l",
            str(data / "log"),
            "-w",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    run(
        [
            *as_user,
            str(bindir / "createdb"),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-U",
            "postgres",
            "test",
        ],
        check=True,
        capture_output=True,
    )
    return f"postgresql://postgres@127.0.0.1:{port}/test"


def in_ci() -> bool:
    """CI set to anything but empty, 0 or false: a missing service fails, never skips."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def postgres_url() -> str:
    """The PostgreSQL server for tests, or pytest.skip/fail as the module docstring says."""
    if "url" in _pg_state:
        url = _pg_state["url"]
    else:
        url = os.environ.get("HOMING_TEST_POSTGRES", DEFAULT_PG)
        if not _reachable(url):
            if in_ci():
                url = None
            else:
                url = _start_throwaway_postgres()
        _pg_state["url"] = url
    if url is None:
        message = (
            f"PostgreSQL is not reachable at {os.environ.get('HOMING_TEST_POSTGRES', DEFAULT_PG)}; "
            "start it (pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start) "
            "or set HOMING_TEST_POSTGRES"
        )
        if in_ci():
            pytest.fail("CI: " + message, pytrace=False)
        pytest.skip(message)
    return url


def _drop_schema(base: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


class StoreFactory:
    """Makes fresh, isolated store URLs of one backend; cleans them up afterwards."""

    def __init__(self, backend: str, tmp_path: Path) -> None:
        self.backend = backend
        self.tmp_path = tmp_path
        self._schemas: list[str] = []
        self._base = postgres_url() if backend == "postgres" else ""

    def url(self, name: str = "homing") -> str:
        if self.backend == "sqlite":
            return f"sqlite:///{self.tmp_path / (name + '-' + uuid.uuid4().hex[:6] + '.db')}"
        schema = f"t_{name}_{uuid.uuid4().hex[:10]}"
        self._schemas.append(schema)
        sep = "&" if "?" in self._base else "?"
        return f"{self._base}{sep}schema={schema}"

    def cleanup(self) -> None:
        for schema in self._schemas:
            _drop_schema(self._base, schema)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def stores(backend: str, tmp_path: Path) -> Iterator[StoreFactory]:
    """Factory of fresh store URLs on the parametrized backend (for tests that need several)."""
    factory = StoreFactory(backend, tmp_path)
    yield factory
    factory.cleanup()


@pytest.fixture
def store_url(stores: StoreFactory) -> str:
    return stores.url()


@pytest.fixture
def clock() -> homing.ManualClock:
    return homing.ManualClock(start=1_800_000_000.0)


@pytest.fixture
def db(store_url: str, clock: homing.ManualClock) -> Iterator[homing.Database]:
    """A migrated store on the parametrized backend with a manual clock."""
    database = homing.connect(store_url, clock=clock)
    assert isinstance(database, homing.Database)
    yield database
    database.close()


@pytest.fixture
def open_db(store_url: str) -> Callable[..., homing.Database]:
    """Open more connections to the same store (other 'processes' in one test)."""
    opened: list[homing.Database] = []

    def _open(**kwargs: object) -> homing.Database:
        database = homing.connect(store_url, **kwargs)  # type: ignore[arg-type]
        assert isinstance(database, homing.Database)
        opened.append(database)
        return database

    yield _open  # type: ignore[misc]
    for d in opened:
        d.close()


@pytest.fixture(params=["sqlite", "postgres", "sharded"])
def jobs(
    request: pytest.FixtureRequest, tmp_path: Path, clock: homing.ManualClock
) -> Iterator[homing.JobAPI]:
    """The job API on SQLite, PostgreSQL and a two-shard PostgreSQL store, with a manual
    clock: the same tests hold for all three."""
    kind = str(request.param)
    factory = StoreFactory("sqlite" if kind == "sqlite" else "postgres", tmp_path)
    urls = [factory.url("s0"), factory.url("s1")] if kind == "sharded" else factory.url()
    database = homing.connect(urls, clock=clock)
    assert isinstance(database, homing.JobAPI)
    yield database
    database.close()
    factory.cleanup()
