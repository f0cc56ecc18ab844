"""SQLite's wake-ups between processes (``homing.store.sqlite_wake``): what they leave on
disk. That a waiter in another process is woken is a contract test of both stores
(tests/store/test_contract.py::test_an_announcement_wakes_a_waiter_in_another_process)."""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from homing.store import sqlite_wake
from homing.store.sqlite import SQLiteStore
from homing.store.sqlite_wake import StoreWake, wake_dir


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _stale_socket(directory: Path, pid: int) -> Path:
    """A socket file whose process is gone: it refuses datagrams."""
    directory.mkdir(mode=0o700, exist_ok=True)
    path = directory / f"{pid}-deadbeef.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(path))
    s.close()
    return path


def eventually(check, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_directory_is_short_per_file_and_per_user_and_not_beside_the_file() -> None:
    path = "/srv/" + "x" * 120 + "/homing.db"  # paths only: nothing is made
    directory = wake_dir(path)
    assert directory == wake_dir(path) != wake_dir("/srv/other.db")
    assert f"-{os.getuid()}-" in directory.name
    assert not str(directory).startswith("/srv/")  # `rm homing.db*` must not meet it
    assert len(str(directory)) + len("/99999999-deadbeef.sock") < 100  # a socket path


def test_dead_processes_sockets_are_swept_and_the_last_one_out_removes_the_directory(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "store.db")
    directory = wake_dir(db)
    swept_at_start = _stale_socket(directory, _dead_pid())
    wake = StoreWake(db)
    wake.attach()  # as an open store handle does
    wake.listen()  # binds this process's socket and sweeps the dead ones
    assert not swept_at_start.exists()
    ours = [n for n in os.listdir(directory) if n.startswith(f"{os.getpid()}-")]
    assert len(ours) == 1
    refusing = _stale_socket(directory, _dead_pid())
    wake.announce("chan", "key")  # a sender that meets a refusing socket removes it
    assert not refusing.exists()
    assert (directory / ours[0]).exists()  # not its own
    del wake
    gc.collect()  # every handle of the store gone: its receiver leaves within a second
    assert eventually(lambda: not directory.exists())


def _receivers(directory: Path) -> int:
    """Live receiver threads of the store whose wake directory is ``directory`` (each
    registers its socket until it ends). Not every thread of the name: another test's
    receiver may still be winding down (it ends within its receive timeout)."""
    return sum(Path(path).parent == directory for path in dict(sqlite_wake._listening))


def test_closing_the_last_handle_stops_listening_though_the_handles_are_still_held(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    directory = wake_dir(str((tmp_path / "store.db").resolve()))
    before = _receivers(directory)
    first, second = SQLiteStore(url), SQLiteStore(url)
    first.wakeup("chan", min_poll=0.01, max_poll=0.1).close()  # listens from now on
    assert _receivers(directory) == before + 1 and len(os.listdir(directory)) == 1
    first.close()
    time.sleep(0.2)
    assert _receivers(directory) == before + 1  # the other handle is open: still listening
    second.close()
    assert eventually(lambda: _receivers(directory) == before and not directory.exists())
    third = SQLiteStore(url)  # a new handle listens again
    third.wakeup("chan", min_poll=0.01, max_poll=0.1).close()
    assert _receivers(directory) == before + 1 and len(os.listdir(directory)) == 1
    third.close()
    assert eventually(lambda: _receivers(directory) == before and not directory.exists())
    assert first is not None and second is not None  # held all along
