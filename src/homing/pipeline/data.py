"""The pipeline's input data: who follows whom, and how each subscriber wants to be told.

Deterministic from the scale, so expected counts are known before the run and a rerun
builds the same tables. Written as Parquet (read by Spark as the subscriptions table).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CHANNELS = ("email", "webhook", "im")
HOOK_CHANNELS = ("webhook", "im")  # delivered over HTTP by homing.http's reliable sender
HOOK_RECEIVED = "WebhookReceived"  # the webhook receiver's effect: one job per message


@dataclass(frozen=True)
class Expected:
    events: int
    subscriptions: int
    notifications: int
    by_channel: dict[str, int]
    bounces: int  # email notifications to addresses whose server answers 550


def pool_size(subscribers: int) -> int:
    return max(10, 2 * subscribers)


def channels_of(k: int) -> list[str]:
    """1-3 channels per subscriber, spread evenly; bouncing subscribers always have email."""
    n = 1 + ((k * 2654435761) >> 7) % 3
    start = k % 3
    chosen = [CHANNELS[(start + i) % 3] for i in range(n)]
    if bounces(k) and "email" not in chosen:
        chosen[0] = "email"
    return chosen


def bounces(k: int) -> bool:
    """About 1 subscriber in 37 has a mailbox whose server answers 550 (a 5xx: perm-fail)."""
    return k % 37 == 5


def followers(topic: int, subscribers: int) -> range:
    """Subscriber ids following ``topic`` are ``(offset + j) % pool`` for j < subscribers."""
    return range(topic * max(1, subscribers // 3), topic * max(1, subscribers // 3) + subscribers)


def write_tables(data_dir: Path, events: int, subscribers: int) -> tuple[Path, Path, Expected]:
    """Write subscriptions.parquet (topic, subscriber_id) and subscribers.parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data_dir.mkdir(parents=True, exist_ok=True)
    pool = pool_size(subscribers)
    topics: list[int] = []
    subs: list[int] = []
    by_channel = dict.fromkeys(CHANNELS, 0)
    bounce = 0
    for t in range(events):
        for j in followers(t, subscribers):
            k = j % pool
            topics.append(t)
            subs.append(k)
            for c in channels_of(k):
                by_channel[c] += 1
                if c == "email" and bounces(k):
                    bounce += 1
    subscriptions = data_dir / f"subscriptions-{events}x{subscribers}.parquet"
    pq.write_table(
        pa.table(
            {"topic": pa.array(topics, pa.int32()), "subscriber_id": pa.array(subs, pa.int64())}
        ),
        subscriptions,
        row_group_size=250_000,
    )
    ks = list(range(pool))
    subscribers_path = data_dir / f"subscribers-{pool}.parquet"
    pq.write_table(
        pa.table(
            {
                "subscriber_id": pa.array(ks, pa.int64()),
                "channels": [",".join(channels_of(k)) for k in ks],
                "email": [
                    (f"bounce-{k}@example.invalid" if bounces(k) else f"user{k}@example.com")
                    for k in ks
                ],
            }
        ),
        subscribers_path,
    )
    expected = Expected(
        events=events,
        subscriptions=len(subs),
        notifications=sum(by_channel.values()),
        by_channel=by_channel,
        bounces=bounce,
    )
    return subscriptions, subscribers_path, expected
