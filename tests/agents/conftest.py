"""Agent tests run tiny networks: one torch thread is faster and steadier on a shared machine.
Compiled-update tests use ``aot_eager`` (tests/agents/test_compiled.py explains why)."""

import pytest
import torch
from torch._dynamo import trace_rules

import rlstash.agents.compiled as compiled


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def no_cuda(monkeypatch):
    """The CUDA tripwire stays on, but ``torch.cuda.is_available`` and ``device_count`` answer
    "none": Dynamo asks them on compiling (to save the CUDA RNG state, to register device
    interfaces); the queries initialize nothing."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    # Dynamo cannot trace the tripwire's Python wrappers of torch.zeros & co (it refuses the
    # builtin they call): the originals come back here (the eager tests keep the wrappers)
    for name in ("empty", "zeros", "ones", "full", "empty_like", "zeros_like", "tensor"):
        monkeypatch.setattr(
            torch, name, getattr(getattr(torch, name), "__wrapped__", getattr(torch, name))
        )
    # Dynamo maps torch's functions to its rules once per process (functools.cache), from the
    # objects torch.* holds at that moment: built while an eager test had the wrappers in place,
    # the map lacks the builtins and refuses them here. Rebuild it with the originals.
    trace_rules.clear_lru_cache()


@pytest.fixture
def aot_eager(monkeypatch, no_cuda):
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
