"""Say which extra to install when an optional dependency is missing, not a traceback."""

from __future__ import annotations

import importlib.util

from homing.errors import ConfigurationError


def require(module: str, extra: str, what: str) -> None:
    """Raise a ConfigurationError naming ``homing[extra]`` if ``module`` cannot be imported."""
    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # a parent package is missing
        found = None
    if found is None:
        raise ConfigurationError(
            f"{what} needs the {module} package: pip install 'homing[{extra}]'"
        )
