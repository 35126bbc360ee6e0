"""Where Ray tests may run: a network namespace that has nothing but loopback.

``python3 run.py test`` runs the ``ray`` tests under ``unshare -n`` (as root, after
``ip link set lo up``), so Ray can only bind to 127.0.0.1 and nothing reaches any network.
Anywhere else they skip, saying why.
"""

from __future__ import annotations

import importlib.util
import socket

import pytest


def interfaces() -> list[str]:
    """The network interfaces of this process's network namespace."""
    return sorted(name for _, name in socket.if_nameindex())


def skip_reason() -> str | None:
    """Why Ray tests cannot run here (None: they can)."""
    if importlib.util.find_spec("ray") is None:
        return "Ray is not installed (pip install '.[ray]'; python3 run.py test installs it)"
    names = interfaces()
    if names != ["lo"]:
        return (
            f"Ray tests run only in a network namespace with nothing but loopback (this one has "
            f"{', '.join(names)}); python3 run.py test runs them under unshare -n"
        )
    return None


REASON = skip_reason()
only_loopback = pytest.mark.skipif(REASON is not None, reason=REASON or "")
