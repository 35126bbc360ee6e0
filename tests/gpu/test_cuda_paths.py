"""Real CUDA paths (marker ``gpu``): skipped where CUDA is absent.

Run them on a machine with a GPU: ``python3 run.py test -m gpu``. They check what fakes
cannot: pinned staging and non-blocking copies with both stream modes, prefetch hand-over to
the caller's stream, GPU and tiered storages (reads ordered after writes on other streams),
the stream storage on a GPU, agents and the collector on CUDA. The CUDA tripwire is off for
them (the root conftest adds ``allow_cuda`` to every ``gpu`` test).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from rlstash.device import Delivery
from rlstash.replay import ReplayBuffer
from rlstash.spec import Field, Spec
from rlstash.storage import StreamStorage, TensorStorage, TieredStorage

pytestmark = pytest.mark.gpu

SPEC = Spec({"obs": Field((3,), torch.float32), "action": Field((), torch.int64)})


def rows(start: int, n: int) -> dict[str, torch.Tensor]:
    i = torch.arange(start, start + n)
    return {"obs": torch.stack([i, i * 2, i * 3], 1).float(), "action": i}


def check_rows(batch: dict[str, torch.Tensor]) -> None:
    """Every row of ``batch`` is intact: obs == action * (1, 2, 3)."""
    obs, action = batch["obs"].cpu(), batch["action"].cpu()
    want = action[:, None].float() * torch.tensor([1.0, 2.0, 3.0])
    torch.testing.assert_close(obs, want)


def busy(stream: torch.cuda.Stream) -> None:
    """Queue a few ms of work on ``stream`` so a missing wait would show."""
    with torch.cuda.stream(stream):
        a = torch.randn(2048, 2048, device="cuda")
        for _ in range(8):
            a = a @ a
            a /= a.norm()


@pytest.mark.parametrize("mode", ["current", "dedicated"])
def test_delivery_through_pinned_staging_on_a_side_stream(mode):
    d = Delivery("cuda", False, stream=mode)
    caller = torch.cuda.Stream()
    with torch.cuda.stream(caller):
        busy(caller)
        outs = []
        for k in range(6):  # staging is reused: earlier batches must not change
            b = rows(10 * k, 64)
            outs.append((b, d(b)))
        for b, out in outs:
            assert out["obs"].device.type == "cuda"
            torch.testing.assert_close(out["obs"].cpu(), b["obs"])
    assert all(t.is_pinned() for t in d._staging.values())


def test_delivery_device_to_host_with_pinning_is_synchronized():
    b = {k: v.cuda() for k, v in rows(0, 1000).items()}
    out = Delivery("cpu", True)(b)
    assert out["obs"].device.type == "cpu" and out["obs"].is_pinned()
    check_rows(out)


@pytest.mark.parametrize("mode", ["current", "dedicated"])
def test_prefetched_batches_are_safe_on_the_callers_stream(mode):
    """Prefetched CUDA batches, used on the caller's (non-default) stream while the thread
    keeps copying: values equal the synchronous buffer's, and a held batch never changes."""
    a = ReplayBuffer(TensorStorage(SPEC, 4096), seed=3)
    b = ReplayBuffer(TensorStorage(SPEC, 4096), seed=3, device="cuda", prefetch=3)
    b.delivery = Delivery("cuda", False, stream=mode)
    for rb in (a, b):
        rb.extend(rows(0, 4096))
    stream = torch.cuda.Stream()
    held = []
    with torch.cuda.stream(stream):
        for step in range(50):
            if step % 10 == 0:
                busy(stream)
            x, y = a.sample(512), b.sample(512)
            assert y["obs"].device.type == "cuda"
            torch.testing.assert_close(y["index"].cpu(), x["index"])
            y["obs"].mul_(1.0)  # a kernel on the caller's stream reading and writing it
            held.append((x, y))
            del y
    torch.cuda.synchronize()
    for x, y in held:
        torch.testing.assert_close(y["obs"].cpu(), x["obs"])
    b.close()


def test_gpu_storage_batches_stay_on_the_gpu_and_are_never_torn():
    """``device=None`` keeps batches on the storage's GPU; extend on one stream while the
    prefetch thread gathers on another: every row read is a complete row."""
    rb = ReplayBuffer(TensorStorage(SPEC, 1024, device="cuda"), seed=0, prefetch=2)
    rb.extend(rows(0, 256))
    assert rb.sample(8)["obs"].device.type == "cuda"
    stop, errors = threading.Event(), []

    def writer():
        s = torch.cuda.Stream()
        k = 256
        with torch.cuda.stream(s):
            while not stop.is_set():
                busy(s)
                rb.extend({key: v.cuda() for key, v in rows(k, 128).items()})
                k += 128

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(100):
            out = rb.sample(256)
            assert out["obs"].device.type == "cuda"
            check_rows(out)
    except AssertionError as exc:
        errors.append(exc)
    finally:
        stop.set()
        t.join()
        rb.close()
    assert not errors, errors[0]


def test_tiered_storage_hot_gpu_cold_host():
    store = TieredStorage(TensorStorage(SPEC, 64, "cuda"), TensorStorage(SPEC, 1024))
    rb = ReplayBuffer(store, seed=0)
    for k in range(0, 1024, 100):
        rb.extend(rows(k, 100))
    out = rb.sample(512)
    assert out["obs"].device.type == "cuda"
    assert store.in_hot.any() and not store.in_hot.all()
    check_rows(out)
    idx = np.arange(0, 1024, 7)
    check_rows(store.read(idx))


def test_tiered_delivery_to_host_and_prefetch():
    store = TieredStorage(TensorStorage(SPEC, 64, "cuda"), TensorStorage(SPEC, 512))
    rb = ReplayBuffer(store, seed=0, device="cpu", pin_memory=True, prefetch=2)
    rb.extend(rows(0, 512))
    for _ in range(10):
        out = rb.sample(128)
        assert out["obs"].device.type == "cpu" and out["obs"].is_pinned()
        check_rows(out)
    rb.close()


def test_stream_storage_on_a_gpu():
    spec = {"obs": ((2,), torch.float32), "action": ((), torch.int64)}
    store = StreamStorage(spec, num_envs=2, capacity=64, device="cuda")
    rb = ReplayBuffer(store, seed=0)
    for t in range(20):
        rb.extend(
            {
                "obs": torch.full((2, 2), float(t), device="cuda"),
                "action": torch.full((2,), t, device="cuda"),
                "reward": torch.ones(2, device="cuda"),
                "terminated": torch.zeros(2, dtype=torch.bool, device="cuda"),
                "truncated": torch.zeros(2, dtype=torch.bool, device="cuda"),
            }
        )
    out = rb.sample(16)
    assert out["obs"].device.type == "cuda"
    torch.testing.assert_close(out["next_obs"][:, 0], out["obs"][:, 0] + 1)
    torch.testing.assert_close(out["action"].float(), out["obs"][:, 0])


def test_dqn_and_sac_update_and_act_on_cuda():
    from rlstash.agents.dqn import DQN, DQNConfig
    from rlstash.agents.sac import SAC

    g = torch.Generator().manual_seed(0)
    dqn = DQN((3,), 4, DQNConfig(net_arch=(32,)), device="cuda")
    batch = {
        "obs": torch.randn(64, 3, generator=g),
        "action": torch.randint(0, 4, (64,), generator=g),
        "reward": torch.randn(64, generator=g),
        "next_obs": torch.randn(64, 3, generator=g),
        "terminated": torch.rand(64, generator=g) < 0.2,
    }
    cuda_batch = {k: v.cuda() for k, v in batch.items()}
    for _ in range(3):
        dqn.update(cuda_batch)
    assert dqn.act(batch["obs"][:5].cuda()).shape == (5,)
    sac = SAC((3,), 2, low=-1, high=1, device="cuda")
    sac_batch = {**cuda_batch, "action": torch.rand(64, 2, device="cuda") * 2 - 1}
    for _ in range(3):
        sac.update(sac_batch)
    assert sac.act(batch["obs"][:5].cuda()).shape == (5, 2)
    assert all(p.is_cuda for p in sac.nets["actor"].parameters())


def test_collector_runs_a_cuda_policy_on_a_host_env():
    """A host env (numpy) with ``device="cuda"``: the policy sees its observations on the GPU
    (pinned staging, the chosen stream), the actions come back to the env, and the batches stay
    on the host, where a replay buffer stores them (rlstash.collect.sync's contract; delivery to
    the GPU happens when sampling)."""
    import gymnasium as gym
    from gymnasium.vector import SyncVectorEnv

    from rlstash.collect import Collector

    env = SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(4)])
    try:
        for mode in ("current", "dedicated"):
            seen = []

            def policy(obs, seen=seen):
                assert obs.device.type == "cuda"
                seen.append(obs.cpu())
                return (obs[:, 2] > 0).long()  # a real policy of the observations

            c = Collector(env, policy, frames_per_batch=64, device="cuda", cuda_stream=mode)
            b = c.collect()
            assert b["obs"].device.type == "cpu" and b["obs"].shape == (16, 4, 4)
            torch.testing.assert_close(torch.stack(seen), b["obs"])  # what the policy saw
            torch.testing.assert_close(b["action"], (b["obs"][..., 2] > 0).long())
    finally:
        env.close()
