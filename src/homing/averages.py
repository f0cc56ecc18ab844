"""Moving averages of run times that decide how much work to take on at once.

The worker's prefetch and the HTTP receiver's handling at receipt both ask "are these
handlers short?". One slow run must answer "no" at once (work queued behind it waits),
while fast runs win the answer back only over a few dozen of them."""

from __future__ import annotations


def rise_fast_fall_slow(mean: float | None, sample: float) -> float:
    """The new average after one run of ``sample`` seconds (the first run sets it)."""
    if mean is None:
        return sample
    return mean + (0.5 if sample > mean else 0.05) * (sample - mean)
