"""Plan before allocate, everywhere (issue 22, class 6): storages, samplers, lane bookkeeping
and agents' networks sized far beyond any machine's memory are refused before anything big is
allocated, with the numbers and the fix; ``rlstash train`` refuses them in one line naming the
flag that sets them, exit 2, and leaves no run directory behind."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import psutil
import pytest
import torch

from rlstash.memory import InsufficientMemoryError
from rlstash.spec import Spec

HUGE = 10**12  # rows, slots or actions: terabytes, beyond any machine
SPEC = {"obs": ((4,), torch.float32), "action": ((), torch.int64)}


def _refused(make: Callable[[], Any]) -> InsufficientMemoryError:
    """``make()`` must raise InsufficientMemoryError with nothing big allocated: numpy's
    allocations traced by tracemalloc, torch's seen in the process's RSS."""
    rss = psutil.Process().memory_info().rss
    tracemalloc.start()
    try:
        with pytest.raises(InsufficientMemoryError) as info:
            make()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"{peak:,} bytes were allocated before the refusal"
    assert psutil.Process().memory_info().rss - rss < 256 << 20
    return info.value


def _stream(backing: str, tmp_path: Path) -> Any:
    from rlstash.storage import StreamStorage

    path = tmp_path / "stream" if backing == "disk" else None
    return StreamStorage(SPEC, 4, HUGE, backing, path=path)


def _tiered(tmp_path: Path) -> Any:
    from rlstash.storage import TensorStorage, TieredStorage

    hot = TensorStorage(SPEC, 16)
    cold = SimpleNamespace(spec=hot.spec, capacity=HUGE, device=torch.device("cpu"))  # a claim
    return TieredStorage(hot, cold)


def _rollout(tmp_path: Path) -> Any:
    from rlstash.storage.rollout import RolloutStorage

    return RolloutStorage(Spec(SPEC), 10**6, 10**6)


def _storage(kind: str) -> Callable[[Path], Any]:
    from rlstash.sampler import PrioritizedSampler
    from rlstash.storage import MemmapStorage, TensorStorage

    return {
        "stream ram": lambda tmp: _stream("ram", tmp),  # main: numpy's "Unable to allocate"
        "stream disk": lambda tmp: _stream("disk", tmp),  # main: the same, for the lanes
        "tensor": lambda tmp: TensorStorage(SPEC, HUGE),
        "memmap": lambda tmp: MemmapStorage(SPEC, HUGE, tmp / "memmap"),
        "prioritized sampler": lambda tmp: PrioritizedSampler().reset(HUGE),
        "tiered row map": _tiered,  # main: numpy's "Unable to allocate" for the row map
        "rollout": _rollout,  # main: torch's allocator error
    }[kind]


@pytest.mark.parametrize(
    "kind",
    ["stream ram", "stream disk", "tensor", "memmap", "prioritized sampler", "tiered row map",
     "rollout"],
)  # fmt: skip
def test_a_storage_beyond_memory_is_refused_before_it_allocates(tmp_path, kind):
    exc = _refused(lambda: _storage(kind)(tmp_path))
    text = str(exc)
    assert exc.needed > exc.free > 0
    assert f"{exc.needed:,}" in text or "TiB" in text  # the numbers
    assert "free" in text and "Fix" in text  # what is free, and the fix
    assert not (tmp_path / "stream").exists() and not (tmp_path / "memmap").exists()


def test_a_stream_names_its_lane_bookkeeping_and_the_capacity_that_fits(tmp_path):
    exc = _refused(lambda: _stream("ram", tmp_path))
    assert "stream: lane bookkeeping" in str(exc)
    fits = exc.plan.max_capacity("ram")
    assert 0 < fits < HUGE and f"capacity <= {fits:,} fits" in str(exc)


@pytest.mark.parametrize(
    "which", ["dqn actions", "discrete sac actions", "ppo actions", "sac net_arch"]
)
def test_an_agent_beyond_memory_is_refused_before_its_networks_are_built(which):
    from rlstash.agents import DQN, PPO, SAC, DiscreteSAC, SACConfig

    make = {
        "dqn actions": lambda: DQN((4,), HUGE),  # main: torch's "DefaultCPUAllocator" error
        "discrete sac actions": lambda: DiscreteSAC((4,), HUGE),
        "ppo actions": lambda: PPO((4,), n_actions=HUGE),
        "sac net_arch": lambda: SAC(
            (3,), 1, np.array([-2.0]), np.array([2.0]), SACConfig(net_arch=(10**6, 10**6))
        ),
    }[which]
    exc = _refused(make)
    text = str(exc)
    assert "\n" not in text and "Adam state" in text and "gradients" in text
    if which.endswith("actions"):
        assert "1,000,000,000,000" in text and "fewer actions" in text and "action_head" in text
    else:
        assert "[2, 1,000,000, 1,000,000]" in text and "net_arch (now 1000000,1000000)" in text


def test_the_dry_run_changes_nothing_for_an_agent_that_fits():
    """The networks are those a build without the dry run makes; no RNG state moved."""
    from rlstash.agents import DQN, planning

    rng = torch.get_rng_state()
    a = DQN((4,), 6, device="cpu")
    assert torch.equal(torch.get_rng_state(), rng)
    token = planning._CHECKED.set(True)  # as if checked already: no dry run
    try:
        b = DQN((4,), 6, device="cpu")
    finally:
        planning._CHECKED.reset(token)
    for (name, p), q in zip(a.nets["q"].named_parameters(), b.nets["q"].parameters()):
        assert torch.equal(p, q) and p.device.type == "cpu", name


def _train(argv: list[str], tmp_path: Path, capsys: Any) -> tuple[int, str]:
    from rlstash.train import cli

    rss = psutil.Process().memory_info().rss
    code = cli.main(["train", *argv, "--steps", "100", "--run-dir", str(tmp_path / "runs"),
                     "--quiet", "--device", "cpu"])  # fmt: skip
    assert psutil.Process().memory_info().rss - rss < 1 << 30
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.mark.parametrize("storage", ["ram", "disk", "tiered"])
def test_train_refuses_a_buffer_beyond_memory_in_one_line_naming_the_flag(
    tmp_path, capsys, storage
):
    code, err = _train(["--buffer-size", str(HUGE), "--storage", storage], tmp_path, capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(
        "rlstash train: error: --buffer-size 1,000,000,000,000: the replay buffer"
    )
    assert "free" in err and "--buffer-size <= " in err and " fits" in err  # main: no flag named
    assert not (tmp_path / "runs").exists()  # nothing left behind


@pytest.mark.parametrize("algo", ["dqn", "sac", "ppo"])
def test_train_refuses_an_agent_with_1e12_actions_in_one_line_naming_the_flags(
    tmp_path, capsys, algo
):
    env = "tests.faults.huge_actions:HugeActions-v0"
    code, err = _train(["--algo", algo, "--env", env], tmp_path, capsys)
    assert code == 2 and len(err.splitlines()) == 1, err  # main: torch's allocator traceback
    assert "networks" in err and "1,000,000,000,000" in err
    assert "--action-head embedding" in err and "--net-arch" in err and "--device" in err
    assert not (tmp_path / "runs").exists()
