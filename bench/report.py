"""Summaries, targets (PASS/FAIL), the Markdown table and the PNG chart of a run."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import median

GROUP_TITLES = {
    "cycle-1": "Full cycle, one job per call (jobs completed/s while a producer inserts)",
    "cycle-100": "Full cycle, batched (insert_many 100 / grab_many 100 / complete_many)",
    "drain-1": "Drain of pre-inserted jobs, one job per call (jobs/s)",
    "drain-100": "Drain of pre-inserted jobs, batched by 100 (jobs/s)",
    "enqueue-1": "Enqueue only, one job per call (jobs/s)",
    "enqueue-100": "Enqueue only, batches of 100 (jobs/s)",
    "latency-1": "Insert-to-start latency at half the system's full-cycle rate (ms)",
    "transport-1": "Bare transports, messages/s (no storage)",
    "workers-1": "Worker scaling: 1 worker process draining 30,000 pre-inserted jobs (jobs/s, once all run)",
    "workers-2": "Worker scaling: 2 worker processes draining 30,000 pre-inserted jobs (jobs/s, once all run)",
    "workers-4": "Worker scaling: 4 worker processes draining 30,000 pre-inserted jobs (jobs/s, once all run)",
    "external": "HTTP and messenger: homing vs the bare transport (bench/http.py, bench/messenger.py)",
}


def cell_line(group: str, system: str, res: dict[str, Any]) -> str:
    if not res.get("ok"):
        return f"{group:12} {system:22} ERROR {res.get('error', '?')[:150]}"
    if "p50_ms" in res:
        return (
            f"{group:12} {system:22} p50 {res['p50_ms']:7.2f} ms  p99 {res['p99_ms']:7.2f} ms"
            f"  at {res['rate']:.0f}/s ({res['started']}/{res['jobs']} started)"
        )
    return f"{group:12} {system:22} {res['rate']:10.0f} /s  ({res.get('wall_s', 0):.1f} s)"


def _values(doc: dict[str, Any], group: str, system: str, key: str = "rate") -> dict[int, float]:
    return {
        c["rep"]: float(c[key])
        for c in doc["cells"]
        if c["group"] == group
        and c["system"] == system
        and c.get("ok")
        and key in c
        and not math.isnan(float(c[key]))
    }


def summarize(doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for g in doc["groups"]:
        rows = {}
        for system in g["systems"]:
            keys = ["p50_ms", "p99_ms"] if g["workload"] == "latency" else ["rate"]
            row: dict[str, Any] = {}
            for key in keys:
                vals = list(_values(doc, g["name"], system, key).values())
                row[key] = {
                    "median": median(vals),
                    "min": min(vals) if vals else None,
                    "max": max(vals) if vals else None,
                    "runs": vals,
                }
            errors = [
                c.get("error")
                for c in doc["cells"]
                if c["group"] == g["name"] and c["system"] == system and not c.get("ok")
            ]
            row["errors"] = errors
            durability = next(
                (
                    c.get("durability")
                    for c in doc["cells"]
                    if c["system"] == system and c.get("durability")
                ),
                "",
            )
            row["durability"] = durability
            rows[system] = row
        out[g["name"]] = rows
    return out


def paired_ratio(
    doc: dict[str, Any], num: tuple[str, str], den: tuple[str, str]
) -> tuple[float, list[float]]:
    a = _values(doc, *num)
    b = _values(doc, *den)
    ratios = [a[r] / b[r] for r in sorted(a) if r in b and b[r] > 0]
    return median(ratios), ratios


@dataclass
class Target:
    id: str
    text: str
    num: tuple[str, str]
    den: tuple[str, str] | None = None
    minimum: float | None = None
    maximum_ms: float | None = None
    key: str = "rate"
    info: bool = False  # shown for context; not one of the targets


def _has(doc: dict[str, Any], group: str, system: str) -> bool:
    return bool(_values(doc, group, system))


def targets(doc: dict[str, Any]) -> list[Target]:
    """The targets of issue 17 (and the HTTP and messenger ones of their issues); worker
    targets use homing's worker when it ran, else the job API. The empty grab's cost and WAL
    per job are measured by bench/grab_cost.py, which ``make bench`` runs after this."""
    wsql = (
        "homing-worker-sqlite" if _has(doc, "cycle-1", "homing-worker-sqlite") else "homing-sqlite"
    )
    wpg = "homing-worker-pg" if _has(doc, "cycle-1", "homing-worker-pg") else "homing-pg"
    c1, c100 = "cycle-1", "cycle-100"
    return [
        Target(
            "pg-vs-pgqueuer",
            f"PostgreSQL durable full cycle ({wpg}) >= 2x pgqueuer (default config; long goal 3x)",
            (c1, wpg),
            (c1, "pgqueuer"),
            2.0,
        ),
        Target(
            "pg-vs-dbos",
            f"PostgreSQL durable full cycle ({wpg}) ahead of DBOS's queue (>= 1x)",
            (c1, wpg),
            (c1, "dbos"),
            1.0,
        ),
        Target(
            "workers-4-vs-1",
            "4 PostgreSQL worker processes >= 1.5x one process (draining the same backlog)",
            ("workers-4", "homing-worker-pg"),
            ("workers-1", "homing-worker-pg"),
            1.5,
        ),
        Target(
            "workers-2-vs-1",
            "(info) 2 PostgreSQL worker processes vs one (draining the same backlog)",
            ("workers-2", "homing-worker-pg"),
            ("workers-1", "homing-worker-pg"),
            1.0,
            info=True,
        ),
        Target(
            "raw-4-vs-1",
            "(info) the raw SKIP LOCKED loop, 4 processes vs one (one commit per job)",
            ("workers-4", "raw-pg"),
            ("workers-1", "raw-pg"),
            1.5,
            info=True,
        ),
        Target(
            "pg-vs-procrastinate",
            f"PostgreSQL durable full cycle ({wpg}) >= 5x procrastinate",
            (c1, wpg),
            (c1, "procrastinate"),
            5.0,
        ),
        Target(
            "pg-api-vs-pgqueuer",
            "(info) the same with the job-API loop, one grab + one complete per job (homing-pg)",
            (c1, "homing-pg"),
            (c1, "pgqueuer"),
            3.0,
            info=True,
        ),
        Target(
            "pg-api-joined-vs-pgqueuer",
            "(info) the job-API loop with each completion and the next grab in one commit "
            "(homing-pg-joined)",
            (c1, "homing-pg-joined"),
            (c1, "pgqueuer"),
            3.0,
            info=True,
        ),
        Target(
            "pg-batched-vs-pgqueuer",
            "PostgreSQL batched full cycle >= 2x pgqueuer batch 100",
            (c100, "homing-pg"),
            (c100, "pgqueuer"),
            2.0,
        ),
        Target(
            "pg-batched-vs-raw",
            "PostgreSQL batched full cycle >= 0.6x raw SKIP LOCKED loop",
            (c100, "homing-pg"),
            (c100, "raw-pg"),
            0.6,
        ),
        Target(
            "sqlite-batched-vs-raw",
            "SQLite durable batched full cycle >= 0.8x raw BEGIN IMMEDIATE loop",
            (c100, "homing-sqlite"),
            (c100, "raw-sqlite"),
            0.8,
        ),
        Target(
            "sqlite-perjob-vs-huey",
            "SQLite durable per-job full cycle >= 1x huey SqliteHuey",
            (c1, "homing-sqlite"),
            (c1, "huey-sqlite"),
            1.0,
        ),
        Target(
            "sqlite-joined-vs-huey",
            "(info) the same with each completion and the next grab in one commit "
            "(homing-sqlite-joined)",
            (c1, "homing-sqlite-joined"),
            (c1, "huey-sqlite"),
            1.0,
            info=True,
        ),
        Target(
            "workers-sqlite-vs-huey",
            f"worker processes, SQLite ({wsql}) >= 1x huey",
            (c1, wsql),
            (c1, "huey-sqlite"),
            1.0,
        ),
        Target(
            "workers-pg-vs-huey",
            f"worker processes, PostgreSQL ({wpg}) >= 1x huey",
            (c1, wpg),
            (c1, "huey-sqlite"),
            1.0,
        ),
        Target(
            "workers-sqlite-vs-celery",
            f"worker processes, SQLite ({wsql}) >= 2x Celery (Redis)",
            (c1, wsql),
            (c1, "celery-redis"),
            2.0,
        ),
        Target(
            "workers-pg-vs-celery",
            f"worker processes, PostgreSQL ({wpg}) >= 2x Celery (Redis)",
            (c1, wpg),
            (c1, "celery-redis"),
            2.0,
        ),
        Target(
            "pg-latency-p50",
            "insert-to-start p50 <= 5 ms on PostgreSQL (LISTEN/NOTIFY), half load",
            ("latency-1", "homing-pg"),
            maximum_ms=5.0,
            key="p50_ms",
        ),
        Target(
            "pg-latency-p99",
            "insert-to-start p99 <= 25 ms on PostgreSQL (LISTEN/NOTIFY), half load",
            ("latency-1", "homing-pg"),
            maximum_ms=25.0,
            key="p99_ms",
        ),
        Target(
            "worker-pg-latency-p99",
            "the same p99 <= 25 ms through homing's worker",
            ("latency-1", "homing-worker-pg"),
            maximum_ms=25.0,
            key="p99_ms",
        ),
        Target(
            "http-vs-starlette",
            "HTTP receiver durable msgs/s >= 0.8x bare Starlette no-op (bench/http.py)",
            ("external", "homing-http"),
            ("external", "starlette (http.py)"),
            0.8,
        ),
        Target(
            "messenger-vs-zmq",
            "messenger (in-memory) >= 0.5x raw pyzmq PUSH/PULL (bench/messenger.py)",
            ("external", "homing-messenger"),
            ("external", "zmq-pushpull (messenger.py)"),
            0.5,
        ),
    ]


def check_targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for t in targets(doc):
        row: dict[str, Any] = {"id": t.id, "target": t.text}
        if t.maximum_ms is not None:
            vals = list(_values(doc, t.num[0], t.num[1], t.key).values())
            m = median(vals)
            row.update(measured=m, runs=vals, required=f"<= {t.maximum_ms:g} ms")
            row["result"] = "n/a" if not vals else ("PASS" if m <= t.maximum_ms else "FAIL")
        else:
            assert t.den is not None and t.minimum is not None
            ratio, ratios = paired_ratio(doc, t.num, t.den)
            a = median(list(_values(doc, *t.num).values()))
            b = median(list(_values(doc, *t.den).values()))
            row.update(
                measured=ratio,
                runs=ratios,
                required=f">= {t.minimum:g}x",
                numerator=f"{t.num[1]} {a:.0f}/s" if a == a else f"{t.num[1]} not measured",
                denominator=f"{t.den[1]} {b:.0f}/s" if b == b else f"{t.den[1]} not measured",
            )
            row["result"] = "n/a" if not ratios else ("PASS" if ratio >= t.minimum else "FAIL")
        if t.info and row["result"] != "n/a":
            row["result"] = "info"
        out.append(row)
    return out


def targets_text(doc: dict[str, Any]) -> str:
    lines = ["Targets (ratios are medians of per-repetition ratios):"]
    for t in doc["targets"]:
        m = t["measured"]
        shown = (
            "not measured" if m != m else (f"{m:.2f}x" if "x" in t["required"] else f"{m:.2f} ms")
        )
        extra = f"  [{t['numerator']} / {t['denominator']}]" if "numerator" in t else ""
        lines.append(f"  {t['result']:4}  {shown:>13}  {t['required']:>8}  {t['target']}{extra}")
    return "\n".join(lines)


def _fmt(v: Any, digits: int = 0) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.{digits}f}"


def markdown(doc: dict[str, Any]) -> str:
    s = doc["settings"]
    pg = s.get("postgres", {})
    probes = [p["fdatasync_per_s"] for p in doc["probes"]]
    rep_probes = [p["fdatasync_per_s"] for p in doc["probes"] if p["group"] is None]
    lines = [
        "# homing side-by-side benchmark",
        "",
        f"`{doc['command']}`: {doc['started']} to {doc.get('finished', '?')} "
        f"({doc.get('elapsed_s', 0) / 60:.1f} min), {doc['reps']} repetitions, "
        f"{doc['consumers']} consumer processes + 1 producer process, batch {doc['batch']}, "
        f"100-byte payloads, no-op handler. {s.get('cpus')} CPUs, {s.get('platform')}, "
        f"Python {s.get('python')}; load average at start {s.get('loadavg_at_start')}.",
        "",
        "Disk fdatasync probe (4 KiB overwrite loop on the benchmark filesystem): "
        f"before each repetition {', '.join(f'{p:,.0f}' for p in rep_probes)}/s; over all "
        f"{len(probes)} probes min {_fmt(min(probes) if probes else None)}, median "
        f"{_fmt(median(probes))}, max {_fmt(max(probes) if probes else None)}/s.",
        "",
        "PostgreSQL "
        + ", ".join(f"{k}={v}" for k, v in pg.items() if k != "data_directory")
        + f". Redis: {s.get('redis')}.",
        "",
        "## Targets",
        "",
        "| result | measured | required | target | numerator / denominator (medians) |",
        "|---|---|---|---|---|",
    ]
    for t in doc["targets"]:
        m = t["measured"]
        shown = "-" if m != m else (f"{m:.2f}x" if "x" in t["required"] else f"{m:.2f} ms")
        nd = f"{t['numerator']} / {t['denominator']}" if "numerator" in t else ""
        lines.append(f"| {t['result']} | {shown} | {t['required']} | {t['target']} | {nd} |")
    lines.append("")
    summary = doc["summary"]
    for g in doc["groups"]:
        name = g["name"]
        rows = summary.get(name, {})
        lines += [f"## {GROUP_TITLES.get(name, name)}", ""]
        if g["workload"] == "latency":
            lines += [
                "| system | p50 ms (median) | p99 ms (median) | p99 runs | durability |",
                "|---|---|---|---|---|",
            ]
            for system, row in rows.items():
                p50, p99 = row["p50_ms"], row["p99_ms"]
                runs = (
                    ", ".join(_fmt(v, 1) for v in p99["runs"])
                    or "; ".join(e or "?" for e in row["errors"])[:120]
                )
                lines.append(
                    f"| {system} | {_fmt(p50['median'], 2)} | {_fmt(p99['median'], 2)} | "
                    f"{runs} | {row['durability']} |"
                )
            lines.append("")
            continue
        refs = [r for r in ("homing-pg", "homing-sqlite") if r in rows]
        cols = ["system", "median /s", "runs", *(f"{r} / this" for r in refs), "durability"]
        lines += ["| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]
        for system, row in rows.items():
            rate = row["rate"]
            runs = (
                ", ".join(_fmt(v) for v in rate["runs"])
                or "; ".join(e or "?" for e in row["errors"])[:120]
            )
            cells = []
            for r in refs:
                ratio, _ = paired_ratio(doc, (name, r), (name, system))
                cells.append("-" if ratio != ratio or r == system else f"{ratio:.2f}x")
            vals = [system, _fmt(rate["median"]), runs, *cells, row["durability"] or ""]
            lines.append("| " + " | ".join(vals) + " |")
        lines.append("")
    lines += [
        "Ratios are medians of per-repetition ratios (the two runs of a pair are made in the "
        "same repetition, minutes apart at most). Every run starts from a fresh database, "
        "file, queue or stream. See bench/README.md for what each system does per job.",
        "",
    ]
    return "\n".join(lines)


def chart(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = doc["summary"]
    groups = [g for g in doc["groups"] if g["workload"] != "latency"]
    lat = [g for g in doc["groups"] if g["workload"] == "latency"]
    panels = groups + lat
    ncols = 2
    nrows = max(1, math.ceil(len(panels) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(14, 3.2 * nrows + 1), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    for ax, g in zip(axes.flat, panels, strict=False):
        rows = summary.get(g["name"], {})
        names = list(rows)
        if g["workload"] == "latency":
            p50 = [rows[n]["p50_ms"]["median"] for n in names]
            p99 = [rows[n]["p99_ms"]["median"] for n in names]
            y = range(len(names))
            ax.barh(
                [i + 0.2 for i in y],
                [0 if v != v else v for v in p99],
                0.4,
                label="p99",
                color="#c44",
            )
            ax.barh(
                [i - 0.2 for i in y],
                [0 if v != v else v for v in p50],
                0.4,
                label="p50",
                color="#48c",
            )
            ax.set_yticks(list(y), names)
            ax.set_xlabel("ms (log)")
            ax.set_xscale("log")
            ax.legend(fontsize=7)
        else:
            med = [rows[n]["rate"]["median"] for n in names]
            lo = [rows[n]["rate"]["min"] or 0 for n in names]
            hi = [rows[n]["rate"]["max"] or 0 for n in names]
            vals = [0 if v != v else v for v in med]
            err = [
                [max(0.0, v - lo_) for v, lo_ in zip(vals, lo, strict=True)],
                [max(0.0, hi_ - v) for v, hi_ in zip(vals, hi, strict=True)],
            ]
            colors = [
                "#2a7" if n.startswith("homing") else ("#888" if n.startswith("raw") else "#48c")
                for n in names
            ]
            ax.barh(range(len(names)), vals, xerr=err, color=colors, capsize=2)
            ax.set_yticks(range(len(names)), names)
            top = max([*vals, *hi, 1.0])
            for i, v in enumerate(vals):
                ax.text(v + top * 0.01, i, f"{v:,.0f}", va="center", fontsize=6)
            ax.set_xlim(0, top * 1.18)
            ax.set_xlabel("per second (bar: median; whiskers: min-max of the repetitions)")
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=7)
        ax.set_title(GROUP_TITLES.get(g["name"], g["name"]), fontsize=8)
    probes = [p["fdatasync_per_s"] for p in doc["probes"]]
    fig.suptitle(
        f"homing vs peers, {doc['reps']} interleaved repetitions, {doc['started']}; "
        f"fdatasync/s min {min(probes):,.0f} median {median(probes):,.0f} max {max(probes):,.0f}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
