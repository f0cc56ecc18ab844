"""max_seen + complement (seed 003's ``is_first_time``) against a plain ``set`` model."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from homing.errors import InvalidArgument
from homing.messenger import SeenSet, is_first_time


def test_seed_example_in_order_and_repeats() -> None:
    s = SeenSet()
    assert [s.is_first_time(i) for i in (1, 2, 3)] == [True, True, True]
    assert s.max_seen == 3 and s.gaps == []
    assert not s.is_first_time(2)
    assert s.is_first_time(7)
    assert s.complement() == {4, 5, 6}
    assert s.is_first_time(5) and s.gaps == [(4, 5), (6, 7)]
    assert not s.is_first_time(5)
    assert s.is_first_time(4) and s.is_first_time(6)
    assert s.gaps == [] and s.max_seen == 7


def test_peek_does_not_change_anything() -> None:
    s = SeenSet()
    s.mark(5)
    assert s.peek(3) and s.peek(6) and not s.peek(5)
    assert s.complement() == {1, 2, 3, 4}


def test_huge_jump_costs_one_interval() -> None:
    """A garbage id of 10**15 must not allocate 10**15 complement entries (the seed's
    plain set would); the interval form keeps one."""
    s = SeenSet()
    s.mark(1)
    s.mark(10**15)
    assert s.interval_count == 1 and s.unseen_count() == 10**15 - 2
    assert s.peek(2) and s.peek(10**15 - 1) and not s.peek(10**15)


def test_encode_decode_roundtrip_and_bad_input() -> None:
    s = SeenSet()
    for i in (1, 4, 9, 7):
        s.mark(i)
    again = SeenSet.decode(s.max_seen, s.encode())
    assert again.gaps == s.gaps and again.max_seen == 9
    with pytest.raises(InvalidArgument):
        SeenSet(5, [(3, 2)])
    with pytest.raises(InvalidArgument):
        SeenSet().mark(0)


def test_bounded_when_most_messages_arrive() -> None:
    """100,000 ids, 5% delayed (reordered by up to 500 positions): the complement never
    holds more than a few dozen intervals, and nothing at the end."""
    rng = random.Random(7)
    order = list(range(1, 100_001))
    late = []
    arrivals: list[int] = []
    for i in order:
        if rng.random() < 0.05:
            late.append((i + rng.randint(1, 500), i))
        else:
            arrivals.append(i)
        while late and late[0][0] <= i:
            arrivals.append(late.pop(0)[1])
        late.sort()
    arrivals += [i for _, i in late]
    s = SeenSet()
    peak = 0
    for i in arrivals:
        assert s.is_first_time(i)
        peak = max(peak, s.interval_count)
    assert s.interval_count == 0 and s.max_seen == 100_000
    assert peak < 100, peak  # a plain set would hold 100,000 ids


ids = st.lists(st.integers(min_value=1, max_value=300), max_size=400)


@settings(max_examples=150, deadline=None)
@given(ids)
def test_is_first_time_matches_a_plain_set(arrivals: list[int]) -> None:
    """Random reordering and duplication: SeenSet, the seed's function and a set agree."""
    model: set[int] = set()
    s = SeenSet()
    max_seen, complement = 0, set()
    for i in arrivals:
        expected = i not in model
        model.add(i)
        assert s.peek(i) == expected
        assert s.is_first_time(i) == expected
        first, max_seen, complement = is_first_time(i, max_seen, complement)
        assert first == expected
        assert s.complement() == complement
        assert s.max_seen == max_seen
    assert SeenSet.decode(s.max_seen, s.encode()).gaps == s.gaps


@settings(max_examples=100, deadline=None)
@given(st.permutations(list(range(1, 60))), st.lists(st.integers(0, 58), max_size=60))
def test_every_id_once_under_reordering_and_duplication(perm: list[int], dups: list[int]) -> None:
    arrivals = list(perm)
    for d in dups:
        arrivals.insert(d, perm[d])
    s = SeenSet()
    firsts = [i for i in arrivals if s.is_first_time(i)]
    assert sorted(firsts) == list(range(1, 60))
    assert s.gaps == []


def test_diff_names_only_the_gaps_a_batch_changed() -> None:
    """Durable mode writes ``diff`` to the store: with 1,000 gaps, filling one id and
    opening one gap touches two rows, not 1,000."""
    s = SeenSet()
    for i in range(2, 2002, 2):
        s.mark(i)
    assert s.interval_count == 1000
    before = s.snapshot()
    s.mark(1)  # fills the first gap
    s.mark(2004)  # opens one above max_seen
    s.mark(1500 - 1)  # fills a gap in the middle
    gone, changed = s.diff(before)
    assert sorted(gone) == [1, 1499] and changed == [(2001, 2004)]
    applied = {lo: hi for lo, hi in before.items() if lo not in gone} | dict(changed)
    assert applied == s.snapshot()


def test_acks_for_any_number_of_ids_fit_the_wire_limits() -> None:
    """200,000 alternating ids need 200,000 ranges: split into messages that decode."""
    from homing.messenger import wire

    ids = list(range(1, 400_001, 2)) + list(range(1_000_000, 1_000_000 + (1 << 21)))
    frames = wire.encode_acks(b"a", b"c", 7, ids)
    assert len(frames) == 4  # 200,002 ranges, at most 65,536 per message
    decoded = [wire.decode(f, 1) for f in frames]
    got = [i for d in decoded for i in d.ids]  # type: ignore[union-attr]
    assert got == ids
