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


def test_uuid7_many_continues_one_ordered_sequence_in_rfc_9562_form() -> None:
    """Batches and single ids interleaved stay ordered and unique, through counter
    overflows (more than 4,096 ids in one millisecond borrow the next one)."""
    import uuid

    from homing import ids

    made: list[str] = []
    for k in range(3_000):
        made += ids.uuid7_many(k % 9 + 1) if k % 2 else [homing.uuid7()]
    made += ids.uuid7_many(20_000)  # overflows the 12-bit counter several times
    assert made == sorted(made) and len(set(made)) == len(made)
    for text in made[::7]:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (7, uuid.RFC_4122, text)
        assert ids.is_uuid(text)
    assert ids.uuid7_many(0) == []


def test_uuid7_in_a_forked_child_never_repeats_the_parents_random_bits() -> None:
    """ids draw random bytes from a per-process pool; a child must not inherit it."""
    import os

    [homing.uuid7() for _ in range(3)]  # the parent's pool is filled
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, homing.uuid7().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    parent = homing.uuid7()
    assert child[19:] != parent[19:]  # the 62 random bits (with the variant)


def test_uuid7_in_a_child_forked_while_the_lock_was_held_does_not_hang() -> None:
    import os
    import signal

    from homing import ids

    with ids._lock:  # another thread of the parent could hold it at the fork
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            signal.alarm(5)  # hung: SIGALRM ends the child with a non-zero status
            homing.uuid7()
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
