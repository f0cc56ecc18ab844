"""homing: exactly-once messaging, durable jobs and data pipelines on SQLite or PostgreSQL."""

from homing.clock import Clock, ManualClock, SystemClock
from homing.database import Database, ShardedDatabase, Transaction, connect
from homing.errors import (
    ConfigurationError,
    CrossShardWrite,
    HomingError,
    InvalidArgument,
    InvalidFilter,
    InvalidState,
    JobCancelled,
    JobNotFound,
    JobTimedOut,
    NotFound,
    PayloadTooLarge,
    PermanentFailure,
    SchemaError,
    StaleLease,
    StoreUnavailable,
    StoreUnreachable,
)
from homing.ids import uuid7
from homing.job_api import JobAPI
from homing.jobs import Failure, Holder, Job, JobDetails, JobSpec, JobState
from homing.worker import App, RetryPolicy

__version__ = "0.1.0"

__all__ = [
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
