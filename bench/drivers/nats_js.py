"""NATS JetStream (local, 4222) through nats-py: a file-storage work-queue stream,
``js.publish`` awaiting each PubAck (a batch: ``publish_async`` then await all acks), a
durable pull consumer (``fetch`` up to 10, or the batch) with an ``ack`` per message.

Sync setting: the server runs with plain ``-js`` (no config), so JetStream's default
``sync_interval`` of 2 minutes applies: a PubAck means "in the OS page cache", not fsynced.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.common import NATS_URL, Tally, payload_bytes
from bench.drivers import Driver

STREAM = "HOMINGBENCH"
SUBJECT = "homingbench.jobs"


async def _connect() -> tuple[Any, Any]:
    import nats

    nc = await nats.connect(NATS_URL)
    return nc, nc.jetstream()


class NatsDriver(Driver):
    name = "nats-js"
    family = "nats"
    batch_ok = True
    durability = "file storage, server default sync_interval=2m (acked = page cache, not fsync)"
    startup_s = 0.3

    def reset(self) -> None:
        from nats.js.api import RetentionPolicy, StorageType

        async def go() -> None:
            nc, js = await _connect()
            try:
                await js.delete_stream(STREAM)
            except Exception:
                pass
            await js.add_stream(
                name=STREAM,
                subjects=[SUBJECT],
                storage=StorageType.FILE,
                retention=RetentionPolicy.WORK_QUEUE,
            )
            await nc.close()

        asyncio.run(go())

    def settings(self) -> dict[str, Any]:
        from importlib.metadata import version

        async def go() -> dict[str, Any]:
            nc, js = await _connect()
            info = nc._server_info
            await nc.close()
            return {"server": info.get("version"), "jetstream": info.get("jetstream")}

        return {
            **asyncio.run(go()),
            "nats-py": version("nats-py"),
            "storage": "file",
            "sync_interval": "server default (2 min; started with -js, no config file)",
            "fetch": 10 if self.batch == 1 else self.batch,
        }

    def open_producer(self) -> Any:
        return _Producer(self.batch)

    def consume(self, slot: int) -> None:
        import nats.errors

        fetch = 10 if self.batch == 1 else self.batch

        async def main() -> None:
            nc, js = await _connect()
            psub = await js.pull_subscribe(SUBJECT, durable="workers", stream=STREAM)
            while True:
                try:
                    msgs = await psub.fetch(fetch, timeout=1)
                except (TimeoutError, nats.errors.TimeoutError):
                    continue
                for m in msgs:
                    Tally.started(m.data)
                    await m.ack()
                    Tally.done()

        asyncio.run(main())


class _Producer:
    def __init__(self, batch: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.nc, self.js = self.loop.run_until_complete(_connect())
        self.batch = batch

    async def _many(self, seqs: list[int]) -> None:
        futs = [await self.js.publish_async(SUBJECT, payload_bytes(i)) for i in seqs]
        await asyncio.gather(*futs)

    def send(self, seqs: list[int]) -> None:
        if len(seqs) == 1:
            self.loop.run_until_complete(self.js.publish(SUBJECT, payload_bytes(seqs[0])))
        else:
            self.loop.run_until_complete(self._many(seqs))

    def close(self) -> None:
        self.loop.run_until_complete(self.nc.close())
        self.loop.close()
