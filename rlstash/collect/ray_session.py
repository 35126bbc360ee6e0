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

import logging
import shutil
import tempfile
from typing import Any

LOCAL_OBJECT_STORE_BYTES = 512 * 1024**2  # object store of a private local instance
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
        """Shut Ray down if this session started or connected it; remove its temporary files."""
        if self.owned:
            self.owned = False
            import ray

            ray.shutdown()
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None
