"""The Ray connection of a :class:`~rlstash.collect.ray.RayCollector`.

Ray is optional (``pip install 'rlstash[ray]'``); it is imported only here and in the actor
module, with an install hint when missing. Three cases::

    RaySession(None)            # Ray already initialized by the caller: used as is, left open
    RaySession("local")         # a private single-node instance in a temporary directory,
                                # shut down and removed by close()
    RaySession("10.0.0.5:6379") # connect to a running cluster; close() disconnects only

A private instance keeps every file it writes (sockets, logs, spilled objects) under one
``rlstash-ray-*`` temporary directory, so ``close()`` leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from typing import Any

import psutil

LOCAL_OBJECT_STORE_BYTES = 512 * 1024**2  # object store of a private local instance
STOP_TIMEOUT = 5.0  # seconds Ray's processes get to exit before they are killed
INSTALL_HINT = "pip install 'rlstash[ray]' (or pip install 'ray>=2.10')"


def import_ray() -> Any:
    """The ``ray`` module, or an ImportError with the install command."""
    try:
        import ray
    except ImportError:
        raise ImportError(
            f"RayCollector needs Ray, which is not installed: {INSTALL_HINT}"
        ) from None
    return ray


class RaySession:
    """Connects to (or starts) Ray for a collector; ``close()`` undoes only what it did."""

    def __init__(self, address: str | None, num_cpus: int) -> None:
        ray = import_ray()
        self.owned, self.temp_dir = False, None
        if address is not None and not isinstance(address, str):
            raise TypeError(
                f"address: expected None, 'local' or a cluster address 'host:port', got {address!r}"
            )
        if ray.is_initialized():
            if address is not None:
                raise ValueError(
                    f"address: Ray is already initialized in this process, got address={address!r}; "
                    "pass address=None to use that connection, or ray.shutdown() first"
                )
            return
        if address is None:
            address = "local"
        if address == "local":
            self.temp_dir = tempfile.mkdtemp(prefix="rlstash-ray-")
            ray.init(
                address="local",
                num_cpus=num_cpus,
                num_gpus=0,
                include_dashboard=False,
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                _temp_dir=self.temp_dir,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
        else:
            ray.init(address=address, logging_level=logging.WARNING)
        self.owned = True

    def close(self) -> None:
        """Shut Ray down if this session started or connected it. A private instance: every
        process it started (raylet, GCS, workers: an actor killed a moment before may still
        be finishing a task) is waited for and, after ``STOP_TIMEOUT`` s, killed; then its
        temporary directory is removed."""
        procs = self._private_processes()
        if self.owned:
            self.owned = False
            import ray

            ray.shutdown()
        _, alive = psutil.wait_procs(procs, timeout=STOP_TIMEOUT)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=STOP_TIMEOUT)
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None

    def _private_processes(self) -> list[psutil.Process]:
        """The processes of the private instance: this process's children that name its
        temporary directory (raylet, GCS, agents) and all their descendants (workers)."""
        if self.temp_dir is None or not self.owned:
            return []
        found: dict[int, psutil.Process] = {}
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if self.temp_dir in " ".join(child.cmdline()):
                    found[child.pid] = child
                    for p in child.children(recursive=True):
                        found[p.pid] = p
        return list(found.values())
