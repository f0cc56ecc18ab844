"""Counting the sender's reads of its outbox rows (``Sender.poll``), for the tests that
check a delivered message is not read back."""

from __future__ import annotations

from typing import Any

import pytest

import homing.http.sender as sender_module
from homing.http import Sender


def outbox_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the messages ``Sender.poll`` reads from now on. The wait before a read
    becomes 5 s (not the 0.25 s of production), so that a loaded machine's slow delivery is
    not mistaken for a read back: a read then means a wake-up did not come."""
    polls: list[str] = []
    real_poll = Sender.poll

    def counted(self: Sender, msg_id: str) -> tuple[bool, Any]:
        polls.append(msg_id)
        return real_poll(self, msg_id)

    monkeypatch.setattr(Sender, "poll", counted)
    monkeypatch.setattr(sender_module, "POLL_S", 5.0)
    return polls
