"""Time each dashboard page with 1,000,000 jobs in a PostgreSQL store (issue 15: < 200 ms).

    .venv/bin/python -m bench.dashboard [--jobs 1000000] [--url postgresql://...]

(as a module: bench/http.py would shadow the standard library's http as a script)

Fills a fresh database (created here, dropped at the end) with jobs of five types:
90% done (finished over the last 7 days, 0.5% in the last hour), 0.5% failed, 0.5%
running, the rest ready; then serves the dashboard and times each page (median of 7).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import httpx
import psycopg

import homing
from homing.dashboard.server import BackgroundDashboard

TYPES = ("FiredEvent", "ProcessSubscription", "ProcessNotification", "email", "webhook")
FILL = [
    # 90% done, finished over 7 days; a few in the last hour
    "UPDATE homing_jobs SET state = 'done', finished_at = %(now)s - (seq %% 604800) "
    "WHERE seq %% 100 < 90",
    "UPDATE homing_jobs SET finished_at = %(now)s - (seq %% 3600) WHERE seq %% 200 = 1",
    "UPDATE homing_jobs SET state = 'failed', finished_at = %(now)s - (seq %% 86400), "
    "last_error = 'smtp said no' WHERE seq %% 1000 BETWEEN 990 AND 994",
    "UPDATE homing_jobs SET state = 'running', lease_expires_at = %(now)s + 600, "
    "available_at = %(now)s + 600, lease_token = md5(seq::text)::uuid "
    "WHERE seq %% 1000 BETWEEN 995 AND 999",
]


def fill(url: str, n: int) -> None:
    with homing.connect(url) as db:
        t0 = time.monotonic()
        for start in range(0, n, 20_000):
            db.insert_many(
                (TYPES[i % 5], {"user": i, "channel": "email" if i % 3 else "webhook"})
                for i in range(start, min(n, start + 20_000))
            )
        print(f"inserted {n:,} jobs in {time.monotonic() - t0:.0f}s")
    with psycopg.connect(url, autocommit=True) as conn:
        for sql in FILL:
            conn.execute(sql, {"now": time.time()})
        conn.execute("VACUUM ANALYZE homing_jobs")


def time_pages(url: str) -> list[tuple[str, float]]:
    with homing.connect(url) as db:
        dash = BackgroundDashboard(db).start()
        base = dash.url.rstrip("/")
        try:
            with httpx.Client(base_url=base, timeout=60) as client:
                failed = client.get("/jobs", params={"state": "failed"}).text
                handle = failed.split('class="job-link"')[0].rsplit('href="/jobs/', 1)[1]
                handle = handle.split('"')[0]
                first = client.get("/jobs").text
                cursor = first.split("cursor=")[1].split('"')[0]
                pages = {
                    "overview /": "/",
                    "jobs /jobs": "/jobs",
                    "jobs page 2": f"/jobs?cursor={cursor}",
                    "jobs state=failed": "/jobs?state=failed",
                    "jobs state=ready type=email": "/jobs?state=ready&type=email",
                    "jobs state=running": "/jobs?state=running",
                    "jobs state=expired (none)": "/jobs?state=expired",
                    "jobs state=scheduled (none)": "/jobs?state=scheduled",
                    'jobs args {"user": 123456}': '/jobs?where={"user": 123456}',
                    "jobs type=webhook (rare)": "/jobs?type=webhook",
                    "job page": f"/jobs/{handle}",
                    "bulk confirm (bounded count)": "/bulk/redrive?state=failed",
                    "engine": "/engine",
                    "http": "/http",
                    "sessions": "/sessions",
                    "messenger": "/messenger",
                    "metrics": "/metrics",
                }
                out = []
                for name, path in pages.items():
                    times = []
                    for _ in range(7):
                        t0 = time.perf_counter()
                        r = client.get(path)
                        times.append(time.perf_counter() - t0)
                        assert r.status_code == 200, (path, r.status_code)
                    out.append((name, statistics.median(times) * 1000))
                return out
        finally:
            dash.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--keep", action="store_true", help="Keep the filled database (printed).")
    args = ap.parse_args()
    name = f"dash_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = args.url.rsplit("/", 1)[0] + "/" + name
    try:
        fill(url, args.jobs)
        print(f"{'page':34} median ms (7 runs), {args.jobs:,} jobs, PostgreSQL")
        for page, ms in time_pages(url):
            print(f"{page:34} {ms:8.1f}")
    finally:
        if args.keep:
            print(f"kept {url}")
        else:
            with psycopg.connect(args.url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
