"""Wake-ups between the processes of one SQLite store, which has no NOTIFY of its own.

A process that waits for work on a store (``SQLiteStore.wakeup``) binds a Unix datagram
socket in a directory of that store's own, mode 0700, under the temporary directory and
named after the user and the database file's resolved path; it is removed with the last
socket in it. A commit that announces work
(``SQLiteStore.notify``) wakes this process's waiters directly (``LocalNotices``) and
sends one datagram, ``channel NUL key``, to every other socket there. The receiving
process's thread hands it to its own ``LocalNotices``. A waiter still polls with its
back-off: a datagram lost (a full socket buffer, another user's process, a platform
without Unix sockets) costs at most a poll step, as before.

Nothing here is trusted: a datagram only makes waiters look for work. Sockets of dead
processes are removed by the first sender that finds them refusing. A process stops
listening (its thread ends, its socket is removed) when its last open handle on the store
is closed (``attach``/``detach``), or collected, or at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import socket
import tempfile
import threading
import weakref
from pathlib import Path

from homing.store.wakeup import LocalNotices

log = logging.getLogger(__name__)

MAX_DATAGRAM = 512  # channel and key names are short identifiers
_RECV_TIMEOUT_S = 1.0  # how often an idle receiver checks that its store is still open


def wake_dir(db_path: str) -> Path:
    """The store's socket directory (see the module's docstring): every process of the
    store derives the same one from the file's resolved path. Not beside the file: a
    directory there would meet every ``rm app.db*`` and be too long for a socket path
    (about 100 bytes) in deep directories."""
    digest = hashlib.sha256(db_path.encode()).hexdigest()[:20]
    return Path(tempfile.gettempdir()) / f"homing-wake-{os.getuid()}-{digest}"


def _sweep(directory: Path) -> None:
    """Remove the sockets of processes that no longer exist (killed ones leave theirs)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        pid_text = name.split("-", 1)[0]
        if not name.endswith(".sock") or not pid_text.isdigit():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.unlink(directory / name)
        except OSError:
            pass  # it exists (another user's), or we cannot tell: leave it


class StoreWake:
    """One store file's announcements in this process: local waiters, and the other
    processes' sockets. Shared by every handle this process has open on the file."""

    def __init__(self, db_path: str) -> None:
        self.local = LocalNotices()
        self.dir = wake_dir(db_path)
        self._lock = threading.Lock()
        self._pid = 0  # the process that made the sockets below (a fork makes new ones)
        self._sender: socket.socket | None = None
        self._receiver: socket.socket | None = None
        self._own = ""  # our socket's name in self.dir, once listening
        self._cannot_listen = False  # binding failed in this process: its waiters poll
        self._users = 0  # open store handles of this process on the file

    # -- the handles using it --------------------------------------------------------------
    def attach(self) -> None:
        """A store handle on the file was opened."""
        with self._lock:
            self._users += 1

    def detach(self) -> None:
        """A store handle on the file was closed: the last one stops the listening."""
        with self._lock:
            self._users -= 1
            if self._users > 0 or self._receiver is None or self._pid != os.getpid():
                return
            self._receiver = None  # its thread closes it and removes its socket
            own, self._own = self._own, ""
        # its thread sees that it is no longer ours at the next datagram: send one now
        if self._sender is not None:
            with contextlib.suppress(OSError):
                self._sender.sendto(b"", str(self.dir / own))

    # -- sending -------------------------------------------------------------------------
    def announce(self, channel: str, key: str = "") -> None:
        """After a commit: wake this process's waiters, then the other processes'."""
        self.local.announce(channel, key)
        try:
            names = os.listdir(self.dir)
        except OSError:
            return  # nobody listens (no directory yet), or it cannot be read: they poll
        sender = self._sender_for_this_process()
        if sender is None:
            return
        message = f"{channel}\0{key}".encode()[:MAX_DATAGRAM]
        for name in names:
            if name == self._own or not name.endswith(".sock"):
                continue
            path = str(self.dir / name)
            try:
                sender.sendto(message, path)
            except (ConnectionRefusedError, FileNotFoundError):
                with contextlib.suppress(OSError):
                    os.unlink(path)  # its process is gone
            except OSError:
                pass  # a full buffer: that process has wake-ups waiting already

    # -- receiving -----------------------------------------------------------------------
    def listen(self) -> None:
        """Receive the other processes' announcements from now on (once per process)."""
        self._sender_for_this_process(listen=True)

    def _sender_for_this_process(self, listen: bool = False) -> socket.socket | None:
        """This process's sending socket (None: no Unix sockets here), made after a fork
        anew; with ``listen``, its receiving socket and thread too, once."""
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child: its own sockets
                self._pid = os.getpid()
                for inherited in (self._sender, self._receiver):
                    if inherited is not None:  # the parent's, copied by fork: ours to close
                        inherited.close()
                self._sender = self._receiver = None
                self._own = ""
                self._cannot_listen = False
                try:
                    self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    self._sender.setblocking(False)
                except (OSError, AttributeError):  # no Unix sockets here: waiters poll
                    self._sender = None
            if listen and self._receiver is None and self._sender is not None:
                if not self._cannot_listen and self._users > 0:
                    self._start_receiver()
            return self._sender

    def _start_receiver(self) -> None:
        name = f"{os.getpid()}-{os.urandom(4).hex()}.sock"
        receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        error = self._bind(receiver, name)
        if error is not None:
            receiver.close()
            self._cannot_listen = True
            log.info("SQLite wake-ups between processes are off (%s): waiters poll", error)
            return
        receiver.settimeout(_RECV_TIMEOUT_S)
        _sweep(self.dir)
        self._receiver, self._own = receiver, name
        with _lock:  # daemon threads get no finally: the exit handler removes it
            _listening[str(self.dir / name)] = os.getpid()
        threading.Thread(
            target=_receive,
            args=(weakref.ref(self), receiver, str(self.dir / name), os.getpid()),
            name="homing-sqlite-wake",
            daemon=True,
        ).start()

    def _bind(self, receiver: socket.socket, name: str) -> OSError | None:
        error: OSError | None = None
        for _ in range(3):
            try:
                self.dir.mkdir(mode=0o700, exist_ok=True)
                receiver.bind(str(self.dir / name))
                return None
            except FileNotFoundError as exc:
                error = exc  # the last process leaving removed the directory meanwhile
            except OSError as exc:
                return exc
        return error


def _leave(path: str, pid: int) -> None:
    """Remove this process's socket (and the directory, if it was the last one); a forked
    child inherits the registry, and leaves its parent's sockets alone."""
    with _lock:
        _listening.pop(path, None)
    if os.getpid() != pid:
        return
    with contextlib.suppress(OSError):
        os.unlink(path)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(path))


def _leave_all() -> None:
    with _lock:
        sockets = list(_listening.items())
    for path, pid in sockets:
        _leave(path, pid)


def _receive(owner: weakref.ref[StoreWake], receiver: socket.socket, path: str, pid: int) -> None:
    """Hand datagrams to the store's local waiters until the store is gone (every handle
    closed, or collected) or the process forked away from this thread."""
    try:
        while True:
            try:
                data = receiver.recv(MAX_DATAGRAM)
            except TimeoutError:
                data = None
            except OSError:
                return
            wake = owner()
            if wake is None or wake._pid != pid or wake._receiver is not receiver:
                return  # the store is gone or closed, or the process forked away
            if data:
                channel, _, key = data.decode("utf-8", "replace").partition("\0")
                wake.local.announce(channel, key)
            del wake
    finally:
        receiver.close()
        _leave(path, pid)


_lock = threading.Lock()
_by_path: weakref.WeakValueDictionary[str, StoreWake] = weakref.WeakValueDictionary()
# This process's bound sockets (path -> pid), removed at exit: one entry a live receiver.
_listening: dict[str, int] = {}
atexit.register(_leave_all)


def store_wake(db_path: str) -> StoreWake:
    """The announcements of one store file in this process (held by its open handles:
    gone with the last of them)."""
    with _lock:
        found = _by_path.get(db_path)
        if found is None:
            found = _by_path[db_path] = StoreWake(db_path)
        return found
