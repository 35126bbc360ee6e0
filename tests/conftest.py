"""Test-wide fixtures. The CUDA tripwire (invariant I1) is on for every test by default.

With the tripwire on, any ``torch.cuda`` entry point that rlstash could reach (init, device
queries, synchronize, streams, events, memory info, ``Tensor.cuda``, ``Tensor.pin_memory``,
``.to("cuda")``, ``pin_memory=True`` allocations) raises :class:`CudaTripped`. A test that
exercises device logic with fakes opts out with ``@pytest.mark.allow_cuda``.
"""

from __future__ import annotations

import functools
import gc
import os
import shutil
import signal
import subprocess

import pytest
import torch
import torch.utils._device

# torch's device context (``with torch.device("meta")``: agents count their networks in a dry
# run on it) knows the factories it redirects by identity, cached on first use: cache the real
# ones now, before the tripwire below wraps torch.empty & co. for a test.
torch.utils._device._device_constructors()

# Agents default to compile="auto": compiling once their eager updates took 60 s. The suite
# (and the trainers its tests start: they inherit this) never compiles by surprise; tests of
# the rule and of compiled updates set it themselves.
os.environ["RLSTASH_COMPILE_AFTER"] = "inf"


class CudaTripped(AssertionError):
    """A CUDA API was called while every device is the CPU."""


_CUDA_FUNCS = [
    "_lazy_init",
    "init",
    "is_available",
    "device_count",
    "current_device",
    "set_device",
    "synchronize",
    "current_stream",
    "default_stream",
    "set_stream",
    "stream",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "max_memory_allocated",
    "reset_peak_memory_stats",
    "empty_cache",
    "get_device_name",
    "get_device_properties",
    "get_device_capability",
    "ipc_collect",
]
_CUDA_CLASSES = ["Stream", "Event"]


def _trip(name: str):
    def raiser(*args, **kwargs):
        raise CudaTripped(f"torch.cuda.{name} was called with every device set to CPU")

    return raiser


def _is_cuda_target(args, kwargs) -> bool:
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.device) and a.type == "cuda":
            return True
        if isinstance(a, str) and a.startswith("cuda"):
            return True
        if isinstance(a, int) and not isinstance(a, bool) and a >= 0 and "device" in kwargs:
            return True
    return False


def _guard_to(orig):
    @functools.wraps(orig)
    def to(self, *args, **kwargs):
        if _is_cuda_target(args, kwargs):
            raise CudaTripped("Tensor.to(cuda) was called with every device set to CPU")
        return orig(self, *args, **kwargs)

    return to


def _guard_factory(orig, name):
    @functools.wraps(orig)
    def factory(*args, **kwargs):
        if kwargs.get("pin_memory"):
            raise CudaTripped(f"torch.{name}(pin_memory=True) was called with every device CPU")
        dev = kwargs.get("device")
        if dev is not None and _is_cuda_target((dev,), {}):
            raise CudaTripped(f"torch.{name}(device=cuda) was called with every device CPU")
        return orig(*args, **kwargs)

    return factory


@pytest.fixture(autouse=True)
def cuda_tripwire(request, monkeypatch):
    """Make every CUDA entry point raise, unless the test is marked ``allow_cuda``."""
    if request.node.get_closest_marker("allow_cuda"):
        yield None
        return
    for name in _CUDA_FUNCS:
        if hasattr(torch.cuda, name):
            monkeypatch.setattr(torch.cuda, name, _trip(name))
    for name in _CUDA_CLASSES:
        monkeypatch.setattr(torch.cuda, name, _trip(name))
    monkeypatch.setattr(torch.Tensor, "cuda", _trip("Tensor.cuda"))
    monkeypatch.setattr(torch.Tensor, "pin_memory", _trip("Tensor.pin_memory"))
    monkeypatch.setattr(torch.Tensor, "to", _guard_to(torch.Tensor.to))
    for name in [
        "empty",
        "zeros",
        "ones",
        "full",
        "empty_like",
        "zeros_like",
        "tensor",
        "as_tensor",
    ]:
        monkeypatch.setattr(torch, name, _guard_factory(getattr(torch, name), name))
    yield CudaTripped


def pytest_configure(config):
    config.addinivalue_line("markers", "allow_cuda: run without the CUDA tripwire (uses fakes)")
    # A suite started in the background of a non-interactive shell (``cmd &``, some CI
    # runners) inherits SIGINT ignored, and so would every process a test starts: the Ctrl-C
    # tests would then test nothing but a timeout. Python's own handler is what a user has.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests run without the tripwire, and are skipped where CUDA is absent.

    ``torch.cuda.is_available()`` is asked only when a ``gpu`` test was collected."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    skip = None
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is False)")
    for item in gpu:
        item.add_marker(pytest.mark.allow_cuda)
        if skip is not None:
            item.add_marker(skip)


@pytest.fixture
def small_fs(tmp_path):
    """An 8 MiB tmpfs mounted for the test (skipped where mounting is not allowed)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        gc.collect()
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
