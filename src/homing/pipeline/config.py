"""What one pipeline run is asked to do (``homing pipeline run``'s options)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class PipelineConfig:
    db: str
    master: str = "local[*]"
    events: int = 20
    subscribers: int = 1000
    workers: int = 3
    concurrency: int = 8
    kills: int = 3
    lock_for: float = 5.0
    retry_scale: float = 1 / 600
    temp_pct: int = 3
    chunk: int = 20_000
    data_dir: Path = Path("pipeline-data")
    run_id: str = ""
    timeout: float = 1800.0
    progress: bool = True
    kill_executor: bool = False  # SIGKILL one executor JVM while a replace is staging
    discard_leftovers: bool = False  # cancel the unfinished jobs of earlier runs first
