"""Pin the public API: a change here is a change users see."""

import homing


def test_public_names() -> None:
    assert set(homing.__all__) >= {
        "connect",
        "Database",
        "ShardedDatabase",
        "Transaction",
        "Job",
        "JobSpec",
        "JobDetails",
        "HomingError",
        "InvalidArgument",
        "StaleLease",
        "JobNotFound",
        "PermanentFailure",
        "ManualClock",
        "uuid7",
        "App",
        "RetryPolicy",
    }
    for name in homing.__all__:
        assert hasattr(homing, name), name


def test_uuid7_is_time_ordered_and_unique() -> None:
    ids = [homing.uuid7() for _ in range(10_000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(i[14] == "7" for i in ids[:10])
