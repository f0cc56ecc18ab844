"""OpenTelemetry spans of jobs (optional: ``homing[otel]``).

A worker observer (``Worker.observers``) that records, for each finished job, a span
``homing.job.wait`` from the job's due time to its start and a span ``homing.job TYPE``
for the run, with the type, handle, attempt and outcome as attributes. Their trace id
is the job's UUID, so every attempt of a job (on any worker, after any crash) lands in
one trace that the job's id finds: ``trace_id_of(job.id)``. The spans are made after the
job finished (with their real start and end times), so the handler pays nothing.

Not yet traced: the insert itself, and the HTTP sender/receiver (no trace context in the
headers).
"""

from __future__ import annotations

import time
import uuid
import zlib
from typing import Any


def trace_id_of(job_id: str) -> int:
    """The trace id of a job's spans: its UUID as a 128-bit number."""
    return uuid.UUID(job_id).int or 1


def _job_context(job_id: str) -> Any:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    span_id = zlib.crc32(job_id.encode()) or 1
    parent = SpanContext(
        trace_id=trace_id_of(job_id),
        span_id=span_id,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


class JobTracer:
    """``worker.observers.append(JobTracer().observe)``; spans go to ``tracer_provider``
    (default: the global one the application configured)."""

    def __init__(self, tracer_provider: Any = None) -> None:
        from opentelemetry import trace

        self.tracer = trace.get_tracer("homing", tracer_provider=tracer_provider)

    def observe(self, job: Any, outcome: str, duration: float) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        end = time.time_ns()
        start = end - int(duration * 1e9)
        ctx = _job_context(job.id)
        attributes = {
            "homing.job.type": job.type,
            "homing.job.handle": job.handle,
            "homing.job.attempt": job.attempts,
        }
        due = int(job.run_at * 1e9)
        if due < start:
            wait = self.tracer.start_span(
                "homing.job.wait", context=ctx, start_time=due, attributes=attributes
            )
            wait.end(end_time=start)
        span = self.tracer.start_span(
            f"homing.job {job.type}",
            context=ctx,
            kind=SpanKind.CONSUMER,
            start_time=start,
            attributes={**attributes, "homing.job.outcome": outcome},
        )
        if outcome not in ("done", "replaced"):
            span.set_status(Status(StatusCode.ERROR, outcome))
        span.end(end_time=end)


def console_provider() -> Any:
    """A tracer provider that prints spans as JSON on stderr (``homing worker --traces``)."""
    import sys

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    return provider
