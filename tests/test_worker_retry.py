"""Retry policies: exponential backoff with jitter, caps, and the SMTP-like schedule."""

from __future__ import annotations

import pytest

from homing.errors import InvalidArgument
from homing.worker import SMTP, RetryPolicy
from homing.worker.retry import DAY, DEFAULT, resolve


def test_backoff_grows_exponentially_up_to_the_cap() -> None:
    p = RetryPolicy(max_attempts=10, base=1, factor=3, max_delay=50, jitter=0)
    assert [p.delay(n) for n in range(1, 7)] == [1, 3, 9, 27, 50, 50]
    assert p.delay(10_000) == 50  # no overflow for absurd attempt numbers


def test_jitter_stays_within_its_bounds_and_spreads() -> None:
    p = RetryPolicy(max_attempts=10, base=10, factor=2, max_delay=1000, jitter=0.5)
    delays = [p.delay(3) for _ in range(500)]
    assert all(20 <= d <= 60 for d in delays)
    assert max(delays) - min(delays) > 20  # actually random, not a constant
    lo = RetryPolicy(max_attempts=3, base=10, jitter=0.5, rng=lambda: 0.0)
    hi = RetryPolicy(max_attempts=3, base=10, jitter=0.5, rng=lambda: 1.0, max_delay=12)
    assert lo.delay(1) == 5 and hi.delay(1) == 12


def test_gives_up_after_max_attempts() -> None:
    p = RetryPolicy(max_attempts=3, base=1)
    assert p.gives_up(2, age=0, next_delay=1) is None
    assert "after 3 attempts" in (p.gives_up(3, age=0, next_delay=1) or "")


def test_smtp_retries_less_and_less_for_four_to_five_days() -> None:
    smtp = RetryPolicy(**{**SMTP.__dict__, "jitter": 0.0, "rng": SMTP.rng})
    age, attempt, delays = 0.0, 1, []
    while True:
        delay = smtp.delay(attempt)
        if smtp.gives_up(attempt, age, delay):
            break
        delays.append(delay)
        age += delay
        attempt += 1
    assert delays[0] == 300  # first retry after 5 minutes
    assert delays == sorted(delays) and delays[-1] == 4 * 3600  # less and less often
    assert 4 * DAY <= age <= 5 * DAY  # and it keeps trying for 4-5 days
    assert 20 <= len(delays) <= 40
    assert resolve("smtp") is SMTP


def test_resolve_and_validation() -> None:
    assert resolve(None) is DEFAULT
    assert resolve(5).max_attempts == 5
    with pytest.raises(InvalidArgument, match="unknown retry policy"):
        resolve("often")
    with pytest.raises(InvalidArgument, match="retry must be"):
        resolve(2.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(InvalidArgument, match="retries forever"):
        RetryPolicy(max_attempts=None)
    with pytest.raises(InvalidArgument, match="jitter"):
        RetryPolicy(jitter=2)
    with pytest.raises(InvalidArgument, match="base"):
        RetryPolicy(base=float("nan"))
