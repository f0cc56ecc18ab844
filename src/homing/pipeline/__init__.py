"""Seed 002's event fan-out on Spark and homing workers (``homing pipeline run``).

FiredEvent -> ProcessSubscription (one per follower, joined in Spark) -> 1-3
ProcessNotification (by channel, in Spark) -> delivered by homing workers over SMTP and
HTTP to local receivers that record every delivery. See docs/pipeline.md.
"""

from homing.pipeline.run import PipelineConfig, Report, print_report, run_pipeline

__all__ = ["PipelineConfig", "Report", "print_report", "run_pipeline"]
