"""IQL and TD3+BC on a real GPU (issue 26 point 4: the offline agents run on "the same update
machinery: compiled, fused Adam, no host reads"). Marker ``gpu``: skipped where CUDA is absent.

- the graphed update (inductor + one CUDA graph) keeps the eager agent's parameters
  (``AGENTS`` below join tests/gpu/test_compiled_cuda.py's graphed-update test);
- a gradient step of the offline loop (a sample of a GPU replay, then the update) makes no host
  wait, eager or graphed: ``torch.cuda.set_sync_debug_mode("warn")`` reports every synchronizing
  call, and each one is listed with the line that made it;
- ``rlstash train --algo A --dataset D --device cuda --buffer-device cuda`` learns from a Minari
  dataset held on the GPU and evaluates in the dataset's env.

CPU CI runs the same logic with a fake graph and the eager sampler: tests/offline/test_agents.py.
"""

from __future__ import annotations

import csv
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlstash.agents.base import read_metrics
from rlstash.agents.iql import IQL, IQLConfig
from rlstash.agents.td3_bc import TD3BC, TD3BCConfig
from rlstash.replay import ReplayBuffer
from rlstash.spec import Field, Spec
from rlstash.storage import StreamStorage
from tests.agents.test_compiled import SMALL

pytestmark = pytest.mark.gpu

AGENTS = {
    "iql": lambda c: IQL((3,), 2, -2.0, 2.0, IQLConfig(net_arch=SMALL, tau=0.5, compile=c)),
    "td3_bc": lambda c: TD3BC(
        (3,), 2, -2.0, 2.0, TD3BCConfig(net_arch=SMALL, policy_delay=2, tau=0.5, compile=c)
    ),
}


def _gpu_replay(rows: int = 5_000) -> ReplayBuffer:
    spec = Spec({"obs": Field((3,), torch.float32), "action": Field((2,), torch.float32)})
    rb = ReplayBuffer(StreamStorage(spec, 1, rows, device="cuda"), seed=0)
    g = np.random.default_rng(0)
    for t in range(0, rows - 1, 100):  # [T=100, N=1] batches, as a dataset is loaded
        rb.extend({
            "obs": g.standard_normal((100, 1, 3), np.float32),
            "action": g.uniform(-2, 2, (100, 1, 2)).astype(np.float32),
            "reward": g.standard_normal((100, 1)).astype(np.float32),
            "terminated": g.random((100, 1)) < 0.01,
            "truncated": np.arange(t, t + 100).reshape(100, 1) % 250 == 249,
        })  # fmt: skip
    return rb


@pytest.mark.parametrize("compile_", [False, True], ids=["eager", "graphed"])
@pytest.mark.parametrize("name", sorted(AGENTS))
def test_an_offline_gradient_step_makes_no_host_wait(name, compile_):
    rb, agent = _gpu_replay(), AGENTS[name](compile_).to("cuda")
    for _ in range(4):  # warm-up: the compile, the capture, the pinned-memory cache
        metrics = agent.update(rb.sample(64))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(20):  # the offline loop's step: train/offline.py iterate
                metrics = agent.update(rb.sample(64))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    waits = sorted({f"{w.filename}:{w.lineno}: {w.message}"[:300] for w in caught
                    if "synchroniz" in str(w.message)})  # fmt: skip
    assert waits == [], f"{len(waits)} host waits in 20 gradient steps:\n" + "\n".join(waits)
    values = read_metrics(metrics)
    assert values and all(np.isfinite(v) for v in values.values()), values


@pytest.mark.parametrize("algo", ["iql", "td3_bc"])
def test_an_offline_run_on_the_gpu_learns_from_a_dataset_held_there(tmp_path, monkeypatch, algo):
    pytest.importorskip("minari", reason="Minari tests need rlstash[minari]")
    from rlstash.cli.main import main
    from tests.offline.conftest import collect

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    collect("test/pend-v0", gym.make("Pendulum-v1", max_episode_steps=50), steps=600)
    code = main(["train", "--quiet", "--device", "cuda", "--buffer-device", "cuda",
                 "--run-dir", str(tmp_path / "runs"), "--name", algo, "--algo", algo,
                 "--dataset", "test/pend-v0", "--steps", "200", "--gradient-steps", "50",
                 "--eval-every", "100", "--eval-episodes", "1", "--set", "net_arch=64,64",
                 "--set", "compile=true"])  # fmt: skip
    assert code == 0
    run = tmp_path / "runs" / algo
    with open(run / "eval.csv") as f:
        evals = list(csv.DictReader(f))
    assert [int(r["step"]) for r in evals] == [100, 200]
    assert all(np.isfinite(float(r["return_mean"])) for r in evals)
    state = torch.load(run / "checkpoint" / "state.pt", map_location="cpu", weights_only=False)
    assert state is not None
    assert main(["eval", str(run), "--episodes", "1"]) == 0
