"""The one back-off formula (homing.backoff) gives exactly the waits each part computed by
its own formula before it was shared: no behaviour change for the worker, HTTP, sessions
and the messenger's retransmission timer."""

from __future__ import annotations

import random

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from homing.backoff import Backoff
from homing.errors import InvalidArgument
from homing.http.policy import RetryPolicy as HttpPolicy
from homing.worker.retry import RetryPolicy as WorkerPolicy

attempts = st.integers(0, 300)
unit = st.floats(0, 1, exclude_max=True)


@given(
    attempt=attempts,
    r=unit,
    base=st.floats(0, 100),
    factor=st.floats(1, 10) | st.floats(1, 1.01),
    cap=st.floats(0, 1e6),
    jitter=st.floats(0, 1),
)
def test_worker_policy_waits_as_before(
    attempt: int, r: float, base: float, factor: float, cap: float, jitter: float
) -> None:
    policy = WorkerPolicy(base=base, factor=factor, max_delay=cap, jitter=jitter, rng=lambda: r)
    n = max(1, attempt)
    raw = min(cap, base * factor ** min(n - 1, 200))
    before = max(0.0, min(cap, raw * (1.0 + jitter * (2.0 * r - 1.0))))
    assert policy.delay(attempt) == pytest.approx(before)


@example(attempt=61, seed=0, initial=1.0, factor=1.03125, extra=6.0)  # exponent stops at 60
@given(
    attempt=attempts,
    seed=st.integers(0, 2**32),
    initial=st.floats(0.01, 10),
    factor=st.floats(1, 4),
    extra=st.floats(0, 1000),
)
def test_http_policy_waits_as_before(
    attempt: int, seed: int, initial: float, factor: float, extra: float
) -> None:
    maximum = initial + extra
    policy = HttpPolicy(initial=initial, maximum=maximum, factor=factor, rng=random.Random(seed))
    rng = random.Random(seed)
    cap = min(maximum, initial * factor ** min(attempt, 60))
    before = cap / 2 + rng.uniform(0, cap / 2)
    assert policy.delay(attempt) == pytest.approx(before)


@given(attempt=attempts, seed=st.integers(0, 2**32))
def test_http_webhook_schedule_waits_as_before(attempt: int, seed: int) -> None:
    policy = HttpPolicy.webhook(rng=random.Random(seed))
    rng = random.Random(seed)
    schedule = policy.schedule
    base = schedule[min(attempt, len(schedule) - 1)]
    before = base * (1 + rng.uniform(-policy.jitter, policy.jitter))
    assert policy.delay(attempt) == pytest.approx(before)


@given(attempts=st.integers(1, 80), retry_in=st.floats(0, 100))
def test_sessions_release_waits_as_before(attempts: int, retry_in: float) -> None:
    from homing.sessions.server import MAX_BACKOFF_S

    before = min(MAX_BACKOFF_S, retry_in * 2 ** (attempts - 1))
    now = Backoff(first=retry_in, factor=2, maximum=MAX_BACKOFF_S).wait(attempts - 1)
    assert now == pytest.approx(before)


def test_a_timer_doubles_up_to_its_cap_and_huge_exponents_do_not_overflow() -> None:
    b = Backoff(first=1.0, maximum=30.0)
    assert [b.after(t) for t in (1.0, 8.0, 20.0)] == [2.0, 16.0, 30.0]
    assert Backoff(first=1.0, factor=999.0, maximum=5.0).wait(10_000) == 5.0
    with pytest.raises(InvalidArgument):
        Backoff(first=1.0, factor=0.5)
    with pytest.raises(InvalidArgument):
        Backoff(first=1.0, jitter=2.0)
