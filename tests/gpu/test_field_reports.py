"""The field reports (``/work/shared/seeds``, docs/guarantees.md) replayed on a real GPU.

Marker ``gpu``: skipped where CUDA is absent (the root conftest lifts the tripwire for them).
Each scenario is one failure a report describes, run where it happened, on CUDA:

1. (000) 16 CPU env workers of ``rlstash train``'s pool under a trainer that uses CUDA hold
   no CUDA context: no worker maps libcuda, and ``nvidia-smi`` lists only the trainer.
2. (001) A physics-like kernel on the default stream writes the observations in place while
   the Collector reads them (policy on the caller's or a dedicated stream), into a GPU and a
   host StreamStorage (``collect_into``: the host one takes the GPU batch by ``extend``, a
   blocking copy): every stored row of 10^5 env steps is the step it claims, never torn
   (halves of two steps) nor stale (an older step).
3. (001) Non-blocking device-to-host copies (Delivery to pinned host memory, a GPU storage
   sampled to the host, the Collector's episode log) are never read before they landed: each
   value equals a synchronous ``.cpu()`` copy taken at the same logical point.
4. (002) ``pin_memory=True`` holds after a transform that builds a new batch.
5. (003) Disk storages deliver to ``cuda`` with prefetch, on the caller's side stream.

Helpers from ``tests/gpu/test_cuda_paths.py`` (``SPEC``, ``rows``, ``check_rows``, ``busy``)
are reused; what that file covers is not repeated here.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from gymnasium.vector import AutoresetMode

from rlstash.collect import Collector
from rlstash.device import Delivery
from rlstash.replay import ReplayBuffer
from rlstash.spec import Field
from rlstash.storage import MemmapStorage, StreamStorage, TensorStorage
from tests.envs.helpers import kill_tree, start_script, wait_for_line
from tests.gpu.test_cuda_paths import SPEC, busy, check_rows, rows

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")


# ------------------------------------------------------------------ stream helpers
def side_stream(dev: torch.device):
    """A new CUDA stream on ``dev`` (None on the CPU: the code below then runs unchanged)."""
    return torch.cuda.Stream(dev) if dev.type == "cuda" else None


def on(stream) -> contextlib.AbstractContextManager:
    """``torch.cuda.stream(stream)``, or nothing for ``None``."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def gpu_work(dev: torch.device, reps: int = 4) -> torch.Tensor:
    """A zero scalar that exists only after ~1-2 ms of matmuls queued on the current stream
    (a tiny version on the CPU): adding it to a value orders that value's kernel after them."""
    n = 2048 if dev.type == "cuda" else 32
    a = torch.randn(n, n, device=dev)
    for _ in range(reps):
        a = a @ a
        a = a / a.norm()
    return torch.nan_to_num(a[0, 0]) * 0


def pinned(t: torch.Tensor) -> bool:
    """Whether ``t`` is pinned (on the CPU-only stand-in runs: True, nothing to pin there)."""
    return t.is_pinned() if torch.cuda.is_available() else True


# ------------------------------------------------------------------ 1. report 000
TRAINER = """
import select, sys, time
import torch
from rlstash.agents.dqn import DQN, DQNConfig
from rlstash.collect import Collector
from rlstash.envs.make import make_vec_env

device = sys.argv[1]
pool = make_vec_env("CartPole-v1", 16, 16, seed=0)  # rlstash train's pool: 16 workers
agent = DQN((4,), 2, DQNConfig(net_arch=(64, 64)), device=device)
x = torch.randn(1024, 1024, device=device)  # the trainer's own CUDA tensors
collector = Collector(pool, lambda obs: agent.act(obs), frames_per_batch=16 * 8, device=device)
collector.collect()
print("READY", *pool.worker_pids, flush=True)
deadline = time.monotonic() + 120  # never outlives a lost test
steps = 0
while time.monotonic() < deadline and not select.select([sys.stdin], [], [], 0)[0]:
    collector.collect()
    x = x @ x / x.norm()
    steps += 16 * 8
pool.close()
print("DONE", steps, flush=True)
"""


def maps_libcuda(pid: int) -> bool:
    """Whether process ``pid`` has libcuda (the CUDA driver: a CUDA context) mapped."""
    return "libcuda" in Path(f"/proc/{pid}/maps").read_text()


TRAINER_DEVICE = "cuda"  # the trainer's device (a CPU stand-in run sets "cpu")


def maps_of(procs: list[psutil.Process]) -> dict[int, bool]:
    """``{pid: maps libcuda}`` of the processes still running."""
    out = {}
    for p in procs:
        try:
            out[p.pid] = maps_libcuda(p.pid)
        except (FileNotFoundError, ProcessLookupError):
            pass  # ended meanwhile
    return out


@pytest.fixture(scope="class")
def cuda_trainer():
    """A trainer subprocess: a CUDA agent and tensors, stepping 16 CartPole workers until
    told to stop (at the end of the class: the GPU is free for the other tests). Yields
    ``(trainer pid, worker pids, every descendant pid)``."""
    proc = start_script(TRAINER, TRAINER_DEVICE)
    try:
        line = wait_for_line(proc, "READY", timeout=120)
        workers = [int(p) for p in line.split()[1:]]
        descendants = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        print(f"trainer {proc.pid}, workers {workers}, descendants {descendants}", flush=True)
        yield proc.pid, workers, descendants
        assert proc.poll() is None, f"the trainer ended early: {proc.stderr.read()}"
        proc.stdin.write("stop\n")
        proc.stdin.close()
        assert wait_for_line(proc, "DONE", timeout=60).startswith("DONE")
        proc.wait(30)
    finally:
        kill_tree(proc)


class TestCpuWorkersUnderACudaTrainer:
    """Report 000: CPU env workers of a CUDA-using trainer create no CUDA context."""

    def test_no_worker_maps_libcuda(self, cuda_trainer):
        trainer, workers, descendants = cuda_trainer
        assert len(workers) == 16 and set(workers) <= set(descendants)
        assert maps_libcuda(trainer) == (TRAINER_DEVICE == "cuda")  # the check sees one
        time.sleep(2.0)  # the workers keep stepping meanwhile
        found = maps_of(psutil.Process(trainer).children(recursive=True))
        assert set(workers) <= set(found), "a worker ended"
        with_cuda = [pid for pid, has in found.items() if has]
        assert not with_cuda, f"processes under the trainer with libcuda mapped: {with_cuda}"

    def test_nvidia_smi_lists_only_the_trainer(self, cuda_trainer):
        nvidia_smi_lists_only_the_trainer(*cuda_trainer)


def nvidia_smi_lists_only_the_trainer(trainer: int, workers: list, descendants: list) -> None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not installed: only the /proc/<pid>/maps half ran")
    out = subprocess.run(
        [smi, "--query-compute-apps=pid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0:
        pytest.skip(f"nvidia-smi failed (exit {out.returncode}): {out.stderr.strip()[:200]}")
    listed = {int(w) for w in out.stdout.split() if w.strip().isdigit()}
    print(f"nvidia-smi compute apps: {sorted(listed)}", flush=True)
    ours = {trainer, *descendants, *workers}
    if trainer not in listed:
        pytest.skip(
            f"nvidia-smi lists pids {sorted(listed)}, not the trainer's {trainer}: it sees "
            "another pid namespace (a container); the /proc/<pid>/maps test is the check here"
        )
    assert listed & ours == {trainer}, f"CUDA contexts in workers: {sorted(listed & ours)}"


# ------------------------------------------------------------------ 2. report 001, streams
class PhysicsLikeEnv:
    """A batched torch env whose step works like a GPU physics engine: ~3 ms of kernels on the
    default stream, then the new observations written in place into the one buffer it returns
    at every step. Row ``e`` after ``t`` steps is ``[t] * h + [t * N + e] * h``, written as
    two kernels with more work between them, so a row read before the step completed is stale
    (an older ``t``) or torn (halves of two steps). The action for step ``t`` must be
    ``t * N + e`` (the policy reads it from the observation); wrong ones are counted on the
    GPU in ``wrong_actions``. Never ends an episode; reward of step ``t`` is ``t``."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int, device: torch.device, width: int = 16) -> None:
        self.num_envs, self.device, self.h = num_envs, device, width // 2
        self.obs = torch.zeros(num_envs, width, device=device)
        self.envs = torch.arange(num_envs, device=device)
        self.wrong_actions = torch.zeros((), dtype=torch.int64, device=device)
        self.t = 0

    def _stream(self):
        return torch.cuda.default_stream(self.device) if self.device.type == "cuda" else None

    def _write(self) -> None:
        t, n, h = self.t, self.num_envs, self.h
        self.obs[:, :h] = (gpu_work(self.device) + t).expand(n, h)
        code = (self.envs + t * n).to(torch.float32)
        self.obs[:, h:] = (code + gpu_work(self.device))[:, None].expand(n, h)

    def reset(self, seed=None, options=None):
        with on(self._stream()):
            self.t = 0
            self._write()
        return self.obs, {}

    def step(self, actions: torch.Tensor):
        with on(self._stream()):
            want = self.envs + self.t * self.num_envs
            self.wrong_actions += (actions != want).sum()
            reward = torch.full((self.num_envs,), float(self.t), device=self.device)
            flags = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
            self.t += 1
            self._write()
        return self.obs, reward, flags, flags.clone(), {}


def code_policy(obs: torch.Tensor) -> torch.Tensor:
    """The action ``t * N + e`` read from the observation's second half, after a little work."""
    return (obs[:, -1] + gpu_work(obs.device, reps=1)).round().to(torch.int64)


def check_stream_rows(store: StreamStorage, n: int, steps: int) -> int:
    """Every valid row of ``store`` (filled from step 0 of a fresh PhysicsLikeEnv, no wrap) is
    the step its slot claims: slot ``p`` of lane ``e`` holds step ``p`` of env ``e``."""
    idx = np.flatnonzero(store.valid)
    assert len(idx) == n * (steps - 1), (len(idx), n, steps)
    out = {k: v.cpu() for k, v in store.read(idx).items()}  # a blocking copy: complete
    p, e = torch.from_numpy(idx // n), torch.from_numpy(idx % n)
    h = out["obs"].shape[1] // 2
    for name, step in (("obs", p), ("next_obs", p + 1)):
        want = torch.cat([step[:, None].expand(-1, h), (step * n + e)[:, None].expand(-1, h)], 1)
        bad = (out[name] != want.float()).any(1)
        assert not bad.any(), (
            f"{int(bad.sum())} of {len(idx)} rows of {name} are torn or stale; first at slot "
            f"{int(p[bad][0])} env {int(e[bad][0])}: {out[name][bad][0].tolist()}"
        )
    assert torch.equal(out["action"], p * n + e)
    assert torch.equal(out["reward"], p.float())
    return len(idx)


@pytest.mark.parametrize("store_on", ["cuda", "cpu"])
@pytest.mark.parametrize("mode", ["current", "dedicated"])
def test_physics_kernel_on_the_default_stream_gives_no_torn_or_stale_rows(
    mode, store_on, dev=CUDA, n=1024, T=50, batches=2
):
    env = PhysicsLikeEnv(n, dev)
    spec = {"obs": Field((16,), torch.float32), "action": Field((), torch.int64)}
    store_dev = dev if store_on == "cuda" else torch.device("cpu")
    store = StreamStorage(spec, n, n * (T * batches + 4), device=store_dev)
    c = Collector(env, code_policy, frames_per_batch=n * T, cuda_stream=mode, seed=0)
    start = time.monotonic()
    for _ in range(batches):
        c.collect_into(store)
    sync(dev)
    assert int(env.wrong_actions) == 0, "the policy read observations of another step"
    checked = check_stream_rows(store, n, T * batches)
    print(
        f"{mode}/{store_on}: {checked} rows checked, {time.monotonic() - start:.2f} s", flush=True
    )


# ------------------------------------------------------------------ 3. report 001, D2H
@pytest.mark.parametrize("where", ["default", "side"])
def test_delivery_to_pinned_host_is_never_read_early(where, dev=CUDA):
    """Each round: queued GPU work, then the source overwritten, then Delivery to pinned host
    memory; the host reads the result at once and it equals the synchronous copy."""
    d = Delivery("cpu", True)
    src = {
        "obs": torch.zeros(4096, 64, device=dev),
        "action": torch.zeros(4096, dtype=torch.int64, device=dev),
    }
    pattern = torch.arange(4096 * 64, dtype=torch.float32).view(4096, 64) % 1000
    stream = side_stream(dev) if where == "side" else None
    with on(stream):
        for k in range(20):
            z = gpu_work(dev)
            src["obs"].copy_(pattern.to(dev) + 1000 * k + z)
            src["action"].copy_((torch.arange(4096, device=dev) + k + z).to(torch.int64))
            out = d(src)
            got = {key: v.clone() for key, v in out.items()}  # the host reads it now
            want = {key: v.cpu() for key, v in src.items()}  # synchronous, same point
            assert all(pinned(v) for v in out.values())
            for key in src:
                assert torch.equal(got[key], want[key]), f"round {k}: {key} read before it landed"
            assert torch.equal(got["obs"], pattern + 1000 * k)


@pytest.mark.parametrize("where", ["default", "side"])
def test_gpu_storage_sampled_to_pinned_host_matches_a_synchronous_read(where, dev=CUDA):
    """A GPU TensorStorage is extended behind queued work (the ring overwrites rows) and
    sampled at once to pinned host memory: every value equals a synchronous read."""
    rb = ReplayBuffer(TensorStorage(SPEC, 4096, device=dev), device="cpu", pin_memory=True, seed=0)
    stream = side_stream(dev) if where == "side" else None
    with on(stream):
        for k in range(24):
            z = gpu_work(dev)
            b = {key: v.to(dev) for key, v in rows(1000 + 512 * k, 512).items()}
            rb.extend({"obs": b["obs"] + z, "action": b["action"]})
            gpu_work(dev)  # the gather and the copy queue behind more work
            out = rb.sample(1024)
            got = {key: out[key].clone() for key in ("obs", "action")}
            want = rb.storage.read(out["index"].numpy())
            assert pinned(out["obs"]) and pinned(out["action"])
            for key in got:
                assert torch.equal(got[key], want[key].cpu()), f"round {k}: {key} read early"
            check_rows(got)
            assert (got["action"] >= 1000).all()  # never unwritten (zeroed) rows
    rb.close()


def host_episodes(reward: np.ndarray, done: np.ndarray) -> list[tuple[float, int]]:
    """Finished episodes ``(return, length)`` of next-step autoreset batches ``[T, N]``, in
    step order (the step after an end is a reset step of no episode)."""
    T, N = done.shape
    ret, length, after = np.zeros(N), np.zeros(N, np.int64), np.zeros(N, bool)
    out = []
    for t in range(T):
        for i in range(N):
            if after[i]:
                after[i] = False
                continue
            ret[i] += reward[t, i]
            length[i] += 1
            if done[t, i]:
                out.append((float(ret[i]), int(length[i])))
                ret[i], length[i], after[i] = 0.0, 0, True
    return out


@pytest.mark.parametrize("mode", ["current", "dedicated"])
def test_collector_episode_log_is_read_only_after_its_copy(mode, dev=CUDA, n=256, T=64):
    """The Collector copies finished episodes to the host asynchronously once per batch, queued
    behind a slow policy; ``stats``, read at once, equals the episodes of a synchronous copy
    of the batches."""
    from rlstash.envs.batched.cartpole import CartPoleVectorEnv

    gen = torch.Generator(device=dev).manual_seed(0)

    def slow_random(obs: torch.Tensor) -> torch.Tensor:
        u = torch.rand(obs.shape[0], device=obs.device, generator=gen)
        return (u + gpu_work(obs.device, reps=2) < 0.5).to(torch.int64)

    env = CartPoleVectorEnv(num_envs=n, device=dev)
    c = Collector(env, slow_random, frames_per_batch=n * T, cuda_stream=mode, seed=0)
    batches = []
    for k in range(4):
        b = c.collect()
        s = c.stats  # drains the copy queued at the end of collect: read now
        got = (s.count, [float(r) for r in s.returns], [int(x) for x in s.lengths])
        batches.append({k: b[k].cpu().numpy() for k in ("reward", "terminated", "truncated")})
        cat = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
        want = host_episodes(cat["reward"], cat["terminated"] | cat["truncated"])
        last = want[-len(s.returns) :]  # stats keeps the most recent 100
        assert got == (len(want), [r for r, _ in last], [x for _, x in last]), f"batch {k}"
    assert len(want) > 1000


# ------------------------------------------------------------------ 4. report 002
def rebuild(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A transform that returns a NEW dict of NEW tensors (one non-contiguous), carrying no
    device or pinning of the batch it got."""
    obs = batch["obs"]
    extra = torch.stack([obs.sum(1), obs[:, 0]]).t()  # a transposed view
    return {"obs": obs * 2.0, "action": batch["action"].clone(), "index": batch["index"] + 0,
            "extra": extra}  # fmt: skip


def check_rebuilt(out: dict[str, torch.Tensor]) -> None:
    obs, action = out["obs"].cpu(), out["action"].cpu()
    torch.testing.assert_close(obs, action[:, None].float() * torch.tensor([2.0, 4.0, 6.0]))
    torch.testing.assert_close(out["extra"].cpu()[:, 0], obs.sum(1) / 2)


@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.parametrize("device", [None, "cpu", "cuda"])
def test_pin_memory_holds_after_a_transform_that_builds_a_new_batch(device, prefetch):
    rb = ReplayBuffer(
        TensorStorage(SPEC, 2048),
        transforms=[rebuild],
        device=device,
        pin_memory=True,
        prefetch=prefetch,
        seed=0,
    )
    rb.extend(rows(0, 2048))
    try:
        for _ in range(10):
            out = rb.sample(256)
            assert set(out) == {"obs", "action", "index", "extra"}
            for key, t in out.items():
                if device == "cuda":
                    assert t.device.type == "cuda", key
                else:
                    assert t.device.type == "cpu" and pinned(t), f"{key} lost its pinning"
            check_rebuilt(out)
    finally:
        rb.close()


def test_pin_memory_holds_when_a_transform_returns_gpu_tensors(dev=CUDA):
    """A transform that computes on the GPU (a normaliser there): ``device='cpu'`` with
    ``pin_memory=True`` still delivers pinned host tensors, complete when returned."""

    def on_gpu(batch):
        return {**batch, "obs": batch["obs"].to(dev) * 2.0 + gpu_work(dev)}

    rb = ReplayBuffer(
        TensorStorage(SPEC, 2048), transforms=[on_gpu], device="cpu", pin_memory=True, seed=0
    )
    rb.extend(rows(0, 2048))
    for _ in range(10):
        out = rb.sample(512)
        obs = out["obs"].clone()  # read at once
        assert out["obs"].device.type == "cpu" and pinned(out["obs"])
        torch.testing.assert_close(obs, out["action"][:, None].float() * torch.tensor([2.0, 4, 6]))


# ------------------------------------------------------------------ 5. report 003
def stream_chunk(t0: int, T: int, n: int) -> dict[str, torch.Tensor]:
    """Steps ``t0 .. t0 + T - 1`` of ``n`` envs: obs ``[t, e, t * n + e]``, action ``t * n + e``."""
    t = torch.arange(t0, t0 + T)[:, None].expand(T, n)
    e = torch.arange(n)[None, :].expand(T, n)
    code = t * n + e
    return {
        "obs": torch.stack([t, e, code], -1).float(),
        "action": code,
        "reward": t.float(),
        "terminated": torch.zeros(T, n, dtype=torch.bool),
        "truncated": torch.zeros(T, n, dtype=torch.bool),
    }


def disk_buffer(kind: str, path: Path, mode: str, dev: torch.device) -> ReplayBuffer:
    if kind == "memmap":
        rb = ReplayBuffer(MemmapStorage(SPEC, 4096, path), seed=3, device=dev, prefetch=3)
        rb.extend(rows(0, 4096))
    else:
        spec = {"obs": Field((3,), torch.float32), "action": Field((), torch.int64)}
        store = StreamStorage(spec, 8, 4096, backing="disk", path=path)
        rb = ReplayBuffer(store, seed=3, device=dev, prefetch=3)
        rb.extend(stream_chunk(0, 500, 8))
    rb.delivery = Delivery(dev, False, stream=mode)  # before the first sample
    return rb


def check_disk_rows(kind: str, y: dict[str, torch.Tensor]) -> None:
    if kind == "memmap":
        check_rows(y)
        return
    obs, nxt, action = y["obs"].cpu(), y["next_obs"].cpu(), y["action"].cpu()
    assert torch.equal(obs[:, 2].long(), action)
    assert torch.equal(obs[:, 0] * 8 + obs[:, 1], obs[:, 2])
    assert torch.equal(nxt[:, 0], obs[:, 0] + 1) and torch.equal(nxt[:, 1], obs[:, 1])


@pytest.mark.parametrize("mode", ["current", "dedicated"])
@pytest.mark.parametrize("kind", ["memmap", "stream"])
def test_disk_storage_delivers_to_cuda_with_prefetch_on_the_callers_stream(
    tmp_path, kind, mode, dev=CUDA
):
    """Batches of a disk storage, prefetched and delivered to ``cuda``, used at once by
    kernels on the caller's side stream with busy work queued on it: each held batch equals
    a synchronous read of the disk rows it names, and its rows are complete."""
    rb = disk_buffer(kind, tmp_path / "disk", mode, dev)
    stream = side_stream(dev)
    held = []
    try:
        with on(stream):
            for step in range(40):
                if step % 8 == 0 and stream is not None:
                    busy(stream)
                y = rb.sample(512)
                assert all(t.device.type == torch.device(dev).type for t in y.values())
                y["obs"].mul_(1.0)  # a kernel on the caller's stream reading and writing it
                held.append({k: v.clone() for k, v in y.items()})  # more reads of it, queued
        sync(dev)
        for y in held:
            want = rb.storage.read(y["index"].cpu().numpy())
            for key, t in want.items():
                assert torch.equal(y[key].cpu(), t.cpu()), key
            check_disk_rows(kind, y)
    finally:
        rb.close()
