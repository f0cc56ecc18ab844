"""pgqueuer (PyPI) on the local PostgreSQL, through its public API.

Producer: ``Queries.enqueue`` (one job, or lists for a batch). Consumer: one ``PgQueuer``
per process with a single entrypoint, run with its default ``batch_size=10`` (or the
harness's batch). Schema installed with ``Queries.install()`` at its default durability
("durable": logged tables), on the server's default settings (fsync and
synchronous_commit on), unlike pgqueuer's published figures (fsync=off on tmpfs).
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.common import JOB_TYPE, PG_URL, Tally, payload_bytes, reset_postgres
from bench.drivers import Driver


async def _connect() -> Any:
    import psycopg

    return await psycopg.AsyncConnection.connect(PG_URL, autocommit=True)


class _Producer:
    def __init__(self, batch: int) -> None:
        from pgqueuer import PsycopgDriver, Queries

        self.loop = asyncio.new_event_loop()
        self.conn = self.loop.run_until_complete(_connect())
        self.queries = Queries(PsycopgDriver(self.conn))
        self.batch = batch

    def send(self, seqs: list[int]) -> None:
        if len(seqs) == 1 and self.batch == 1:
            coro = self.queries.enqueue(JOB_TYPE, payload_bytes(seqs[0]))
        else:
            coro = self.queries.enqueue(
                [JOB_TYPE] * len(seqs), [payload_bytes(i) for i in seqs], [0] * len(seqs)
            )
        self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()


class PgQueuerDriver(Driver):
    name = "pgqueuer"
    family = "postgres"
    batch_ok = True
    durability = (
        "logged tables, synchronous_commit=on (server defaults); jobs deleted on completion"
    )
    startup_s = 0.5

    def reset(self) -> None:
        from pgqueuer import PsycopgDriver, Queries

        reset_postgres(PG_URL)

        async def install() -> None:
            conn = await _connect()
            await Queries(PsycopgDriver(conn)).install()
            await conn.close()

        asyncio.run(install())

    def settings(self) -> dict[str, Any]:
        import pgqueuer

        return {
            "version": pgqueuer.__version__,
            "driver": "PsycopgDriver",
            "batch_size": 10 if self.batch == 1 else self.batch,
            "install durability": "durable (default)",
        }

    def open_producer(self) -> _Producer:
        return _Producer(self.batch)

    def consume(self, slot: int) -> None:
        from pgqueuer import PgQueuer

        batch_size = 10 if self.batch == 1 else self.batch

        async def main() -> None:
            conn = await _connect()
            pgq = PgQueuer.from_psycopg_connection(conn)

            @pgq.entrypoint(JOB_TYPE)
            async def noop(job: Any) -> None:
                Tally.started(job.payload)
                Tally.done()

            await pgq.run(batch_size=batch_size)

        asyncio.run(main())
