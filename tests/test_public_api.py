"""Pin the public API: a change here is a change users see."""

import homing


def test_public_names() -> None:
    """Exactly these names: adding one is a decision too (it becomes a promise)."""
    assert sorted(homing.__all__) == sorted(
        [
            "App",
            "Clock",
            "ConfigurationError",
            "CrossShardWrite",
            "Database",
            "Failure",
            "Holder",
            "HomingError",
            "InvalidArgument",
            "InvalidFilter",
            "InvalidState",
            "Job",
            "JobAPI",
            "JobDetails",
            "JobCancelled",
            "JobNotFound",
            "JobTimedOut",
            "JobSpec",
            "JobState",
            "ManualClock",
            "NotFound",
            "PayloadTooLarge",
            "PermanentFailure",
            "RetryPolicy",
            "SchemaError",
            "ShardedDatabase",
            "StaleLease",
            "StoreUnavailable",
            "StoreUnreachable",
            "SystemClock",
            "Transaction",
            "connect",
            "uuid7",
        ]
    )
    for name in homing.__all__:
        assert hasattr(homing, name), name


def test_worker_public_names() -> None:
    import homing.worker

    assert sorted(homing.worker.__all__) == sorted(
        [
            "DEFAULT",
            "NEVER",
            "SMTP",
            "App",
            "Handler",
            "JobContext",
            "LeaseLost",
            "RetryLater",
            "RetryPolicy",
            "Worker",
            "WorkerStats",
        ]
    )
    for name in homing.worker.__all__:
        assert hasattr(homing.worker, name), name


def test_uuid7_is_time_ordered_and_unique() -> None:
    ids = [homing.uuid7() for _ in range(10_000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(i[14] == "7" for i in ids[:10])
