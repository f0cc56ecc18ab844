"""``homing serve`` in a real process, and the example, on both backends."""

from __future__ import annotations

import os
import runpy
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

import homing
from homing.http import Sender

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_homing_serve_receives_and_drains_the_outbox(stores: Any) -> None:
    url = stores.url("serve")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "homing",
            "--db",
            url,
            "serve",
            "--port",
            str(port),
            "--setup",
            "examples.http_orders:setup",
            "--allow-host",
            "127.0.0.1",
            "--batch",
            "16",
            "--secret",
            "old=a-retired-secret-of-20",
            "--secret",  # rotation: both verify, the first one signs what serve sends
            "new=0123456789abcdef-new",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                info = httpx.get(base + "/_homing/info", timeout=2).json()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "homing serve did not start"
                time.sleep(0.1)
        assert info["nodes"] == ["/reserve"] and info["signed"] is True
        unsigned = httpx.post(
            base + "/reserve",
            content=b'{"sku": "x", "qty": 1}',
            headers={"homing-message-id": homing.uuid7(), "content-type": "application/json"},
        )
        assert unsigned.status_code == 401 and "not signed" in unsigned.json()["detail"]
        assert httpx.delete(f"{base}/_homing/inbox/{homing.uuid7()}").status_code == 401
        db = homing.connect(url)
        assert isinstance(db, homing.Database)
        try:
            # this process only stores; the serve process's dispatcher delivers
            sender = Sender(db, dispatch=False)
            handle = sender.enqueue("put", base + "/reserve", {"sku": "kiwi", "qty": 5})
            assert handle.wait(60) == {"reserved": 5, "sku": "kiwi"}
            with db.store.transaction() as tx:
                assert tx.query("SELECT sku, qty FROM reservations") == [("kiwi", 5)]
        finally:
            db.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0


def test_serve_mounts_the_sessions_api_when_it_exists(db: homing.Database) -> None:
    from starlette.routing import Mount

    from homing.http import Receiver
    from homing.serve import build_app

    app = build_app(Receiver(db, dispatch=False), db)
    paths = [r.path for r in app.routes if isinstance(r, Mount)]
    try:
        import homing.sessions.asgi  # noqa: F401
    except ImportError:
        assert paths == [""]
    else:
        assert paths == ["/sessions", ""]


def test_serve_refuses_bad_flags(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from homing.cli import cli

    runner = CliRunner()
    url = f"sqlite:///{tmp_path / 'x.db'}"
    result = runner.invoke(cli, ["--db", url, "serve", "--node", "no-equals-sign"])
    assert result.exit_code != 0 and "/path=module:function" in result.output
    result = runner.invoke(cli, ["--db", url, "serve", "--setup", "nosuchmodule_xyz:f"])
    assert result.exit_code != 0 and "cannot import" in result.output
    result = runner.invoke(cli, ["--db", url, "serve", "--secret", "no-equals"])
    assert result.exit_code != 0 and "KEYID=SECRET" in result.output
    result = runner.invoke(cli, ["--db", url, "serve", "--secret", "k=short"])
    assert result.exit_code != 0 and "16 characters" in result.output
    result = runner.invoke(cli, ["--db", url, "serve", "--batch", "-1"])
    assert result.exit_code != 0 and "--batch" in result.output


def test_the_example_runs() -> None:
    result = runpy.run_path(str(ROOT / "examples" / "http_orders.py"))["main"]()
    assert result["reservations"] == [["apple", 3], ["fig", 2], ["pear", 1]]


def test_homing_serve_keeps_the_store_tidy(stores: Any) -> None:
    """A deployment of ``homing serve`` alone (no worker, no cron entry) stays bounded:
    the server runs ``homing gc`` on its own schedule, as a worker and a sessions server
    do. A job finished long ago (aged here past the 7-day retention) is deleted while the
    server runs."""
    url = stores.url("serve_tidy")
    db = homing.connect(url)
    assert isinstance(db, homing.Database)
    try:
        db.insert("t", {"n": 1})
        job = db.grab("t", lock_for=30)
        assert job is not None
        db.complete(job)
        with db.store.transaction() as tx:  # finished 40 days ago, as far as gc can tell
            tx.execute("UPDATE homing_jobs SET finished_at = finished_at - ?", (40 * 86400,))
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "homing", "--db", url, "serve", "--port", str(port)]
            + ["--gc-every", "0.3", "--vacuum-every", "0"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    db.details(job.handle)
                except homing.NotFound:
                    break
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.1)
            else:
                raise AssertionError("homing serve never collected the old job")
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    finally:
        db.close()
