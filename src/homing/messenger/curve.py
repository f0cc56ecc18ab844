"""CurveZMQ for the messenger: key files, and the ZAP handler that binds names to keys.

With ``Curve(authorized_keys_dir=...)`` a listener accepts only the public keys found there,
and each key's file stem is the only sender name it may use (``primary.key`` -> ``primary``):
the I/O thread compares the ZAP User-Id of every frame's connection with the name in it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import zmq
import zmq.auth

from homing.errors import ConfigurationError
from homing.messenger.model import Curve


def check_destination(curve: Curve | None, destination: str) -> None:
    if curve is not None and destination not in curve.server_public_keys:
        raise ConfigurationError(
            f"CURVE is on but no server public key is configured for {destination}; add it "
            "to Curve(server_public_keys={destination: 'server.key'})"
        )


def load_secret(path: str | Path) -> tuple[bytes, bytes]:
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot read CURVE key file {path}: {exc}") from exc
    if not secret:
        raise ConfigurationError(
            f"{path} holds no secret key; pass the .key_secret file made by "
            "zmq.auth.create_certificates"
        )
    return public, secret


def start_authenticator(ctx: zmq.Context[Any], curve: Curve) -> tuple[Any, dict[str, str] | None]:
    """CURVE listeners need a ZAP handler; one per zmq.Context, started before binding.
    Returns it and, with ``authorized_keys_dir``, the map User-Id (z85 key) -> name."""
    from zmq.auth.thread import ThreadAuthenticator

    location = curve.authorized_keys_dir
    names: dict[str, str] | None = None
    if location is not None:
        if not Path(location).is_dir():
            raise ConfigurationError(
                f"authorized_keys_dir {location} is not a directory of public .key files"
            )
        names = {}
        for path in sorted(Path(location).glob("*.key")):
            public, _ = zmq.auth.load_certificate(str(path))
            names[public.decode("ascii")] = path.stem
    auth = ThreadAuthenticator(ctx, log=logging.getLogger("homing.messenger.auth"))
    try:
        auth.start()
    except zmq.ZMQError as exc:
        raise ConfigurationError(
            "cannot start the CURVE authenticator: another one runs on this zmq.Context "
            f"({exc}); give each CURVE listener its own context"
        ) from exc
    auth.configure_curve(
        domain="*",
        location=str(location) if location is not None else zmq.auth.CURVE_ALLOW_ANY,
    )
    return auth, names
