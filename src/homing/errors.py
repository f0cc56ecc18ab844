"""One exception hierarchy for homing; every message says what was wrong and what to do.

HomingError
 +-- ConfigurationError      bad URL, missing driver, unsupported option
 +-- StoreUnavailable        the database cannot be reached
 |    +-- StoreUnreachable   no connection could be had: nothing was sent
 +-- SchemaError             the database schema is newer than this homing, or broken
 +-- InvalidArgument (ValueError)
 |    +-- PayloadTooLarge
 |    +-- InvalidFilter      a malformed ``where=`` search
 |    +-- CrossShardWrite    a write that would span shards of a sharded store
 +-- NotFound (LookupError)
 |    +-- JobNotFound
 +-- StaleLease              the lease token no longer holds the job (fencing)
 +-- InvalidState            the operation does not apply to the job's state
 |    +-- JobCancelled       the job was cancelled (``cancel``): its completion is refused
 |    +-- JobTimedOut        the job's attempt ran past its timeout: its completion is refused
 +-- PermanentFailure        raised by a handler: do not retry
"""

from __future__ import annotations


class HomingError(Exception):
    """Base class of every error homing raises on purpose."""


class ConfigurationError(HomingError):
    """homing was configured in a way it cannot work with."""


class StoreUnavailable(HomingError):
    """The database could not be reached or refused the connection."""


class StoreUnreachable(StoreUnavailable):
    """No connection to the database could be had (refused, timed out, or the shard is
    marked down): the operation was not sent, so it may safely go elsewhere or be retried."""


class SchemaError(HomingError):
    """The database schema does not match what this version of homing knows."""


class InvalidArgument(HomingError, ValueError):
    """An argument given to homing's API is malformed; nothing was changed."""


class PayloadTooLarge(InvalidArgument):
    """A message or job body is over the configured size limit; nothing was stored."""


class InvalidFilter(InvalidArgument):
    """A ``where=`` search filter is malformed; nothing was grabbed."""


class CrossShardWrite(InvalidArgument):
    """A write inside one shard's transaction names a job or unique key that lives on
    another shard: a transaction spans one shard, so nothing was changed."""


class NotFound(HomingError, LookupError):
    """The thing asked for does not exist (any more)."""


class JobNotFound(NotFound):
    """No job has this handle: it never existed, or it finished and was garbage-collected."""


class StaleLease(HomingError):
    """The caller's lease on a job is no longer valid; nothing was changed.

    The lease expired and another worker grabbed the job (or the job was finished by
    someone else). The caller must drop its work on the job: the new holder owns it now.
    """


class InvalidState(HomingError):
    """The job is not in a state where this operation applies; nothing was changed."""


class JobCancelled(InvalidState):
    """The job was cancelled (``Database.cancel``); its holder's completion is refused and
    nothing it wrote in the job's transaction is kept. Stop working on it."""


class JobTimedOut(InvalidState):
    """The job's attempt ran past its timeout and was failed (retryable); the late
    completion of that attempt is refused. The next attempt runs it again."""


class PermanentFailure(HomingError):
    """Raise from a handler to fail its job permanently, without retries (like an SMTP 5xx)."""
