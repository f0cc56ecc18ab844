"""A run's report: what each stage did, the deliveries, the checks; printed as a table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from homing.pipeline import data


@dataclass
class Report:
    run: str
    db: str
    master: str
    expected: data.Expected
    stages: list[dict[str, Any]] = field(default_factory=list)
    deliveries: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    spark: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.checks.get("ok"))

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "db": self.db,
            "master": self.master,
            "expected": self.expected.__dict__,
            "stages": self.stages,
            "deliveries": self.deliveries,
            "checks": self.checks,
            "spark": self.spark,
            "seconds": round(self.seconds, 2),
        }


def print_report(report: Report, console: Any) -> None:
    from homing._tables import print_table

    d = report.as_dict()
    dv, ck = d["deliveries"], d["checks"]
    console.print(f"homing pipeline run {report.run} on {report.db} (Spark {report.master})")
    rows: list[tuple[Any, ...]] = [
        ("FiredEvent (inserted)", "", report.expected.events, "", "", "", "")
    ]
    rows += [
        (
            st["stage"],
            st["parents"],
            st["children"],
            st["commits"],
            "",
            f"{st['seconds']:.1f}",
            st["children_per_s"],
        )
        for st in d["stages"]
    ]
    rows.append(
        (
            "deliveries",
            ck["notifications"],
            dv["delivered"],
            ck["retries"],
            dv["duplicates_suppressed"],
            f"{dv['seconds']:.1f}",
            dv["per_s"],
        )
    )
    print_table(("stage", "in", "out", "commits", "dups", "secs", "per s"), rows, console=console)
    console.print(
        "commits: Spark commits (stages) or retries (deliveries); dups: duplicates suppressed; "
        "deliveries by channel: "
        + ", ".join(f"{k} {v}" for k, v in sorted(dv["by_channel"].items()))
    )
    verdict = "[bold green]OK[/]" if report.ok else "[bold red]FAILED[/]"
    console.print(
        f"perm-failed (SMTP 5xx bounces): {ck['notifications_perm_failed']} of "
        f"{report.expected.bounces} expected; temporary refusals (451/503): "
        f"{dv['temporary_refusals']}; webhook answers lost: {dv['acks_lost']}; "
        f"outbox: {dv['outbox']}; workers killed: {dv['workers_killed']}; "
        f"left unfinished: {ck['left_unfinished']}"
    )
    if dv["per_s"] is not None:
        console.print(
            f"[bold]deliveries: {dv['delivered']} in {dv['seconds']:.1f} s from the first to "
            f"the last = {dv['per_s']:,.0f}/s[/] (email, webhook and IM effects at the "
            f"receivers; the run's wall time from the first Spark stage: "
            f"{dv['wall_seconds']:.1f} s)"
        )
    if d["spark"]:
        sp = d["spark"]
        console.print(
            f"Spark executors killed (SIGKILL, during a replace): {sp['executors_killed']} "
            f"(pids {sp['pids']}, {sp['staged_batches_at_kill']} staged batch(es) uncommitted)"
        )
    console.print(
        f"lost = {ck['lost']}, duplicated = {ck['duplicated']}, unexpected = {ck['unexpected']}"
        f"  -> {verdict}   total {d['seconds']:.1f}s"
    )
