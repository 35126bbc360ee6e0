#!/usr/bin/env python3
"""Stream-storage benchmark: rlstash StreamStorage (frame stacks rebuilt on read) against
TorchRL and Stable-Baselines3 on Atari-sized frame stacks, memory and sample throughput.

    python3 bench/stream.py [--quick] [--workloads W2,pong] [--reps N]
                            [--out bench/results/stream.md]

Runs in ``.venv-bench`` (re-executes itself there). Workloads:

- ``W2``: synthetic episodes (random lengths, mean 500 steps, 25% of them truncated) of N = 8
  envs stepping in lockstep, written as a gymnasium vectorized collector yields them (next-step
  autoreset: the row after an episode's last step holds its final observation); frames uint8
  84x84 (random bytes, the first 4 bytes of each frame hold its row id so every sample is
  checked); 4-frame stacks; 100,000 transitions per buffer; batch 32.
- ``pong``: ALE/Pong-v5 (frameskip=1), gymnasium ``AtariPreprocessing`` (frame_skip=4, 84x84
  grayscale, noop_max=30) and ``FrameStackObservation(4)``, 8 envs in a ``SyncVectorEnv``,
  random policy, 50,000 agent steps collected once with rlstash's Collector (cached in
  ``bench/.work/stream-cache``) and fed to every buffer.

Buffers: ``rlstash`` (StreamStorage: W2 single frames with ``frame_stack=4``, Pong the env's
stacks with ``stacked_input=True``), ``torchrl-stacked`` (ReplayBuffer + LazyTensorStorage of
stacked obs and next obs), ``torchrl-catframes`` (TorchRL's own memory saving: single frames
``pixels`` and ``("next", "pixels")`` in a LazyTensorStorage, stacked at sample time by
``CatFrames.make_rb_transform_and_sampler``: a SliceSampler of 4-step slices + CatFrames),
``sb3`` and ``sb3-optimized`` (Stable-Baselines3 ReplayBuffer with n_envs=8,
optimize_memory_usage off/on). Every peer holds the same transitions (the first M of each env);
the stream holds every row of the same stretch, so at least as many.

Method: memory = RSS increase of a fresh process per buffer (after loading the data and a
warm-up build on a tiny copy, then malloc_trim), after fill + one sample. Throughput = batches
of 32 per second, all buffers of a group built in one fresh process and timed interleaved
(``bench.common.interleaved``, medians); when the buffers do not fit in memory together, each
group holds rlstash plus the peers that fit, and ratios to rlstash come from the same process.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV_PY = ROOT / ".venv-bench" / "bin" / "python"
WORK = HERE / ".work" / "stream"
CACHE = HERE / ".work" / "stream-cache"
sys.path.insert(0, str(HERE))

FRAME, K, NUM_ENVS, BATCH = (84, 84), 4, 8, 32
FRAME_BYTES = FRAME[0] * FRAME[1]
PEERS = ("rlstash", "torchrl-stacked", "torchrl-catframes", "sb3", "sb3-optimized")


# ----------------------------------------------------------------------------- data


@dataclasses.dataclass
class Episodes:
    """Rows of N envs in lockstep (gymnasium next-step autoreset), all arrays [T, N, ...].

    ``frames`` is the newest frame of each row's observation; ``ep`` the row's position in its
    episode (a final-obs row is its episode's last). The stack of row t is frames
    ``t - min(j, ep[t])`` for j = 3..0 (episode start repeated, as FrameStackObservation).
    """

    frames: np.ndarray  # uint8 [T, N, 84, 84]
    action: np.ndarray  # int64 [T, N]
    reward: np.ndarray  # float32 [T, N] (0 on final-obs rows)
    terminated: np.ndarray  # bool [T, N]
    truncated: np.ndarray  # bool [T, N]
    ep: np.ndarray  # int64 [T, N]
    n_actions: int
    stamped: bool  # frame ids in the first 4 bytes: samples can be checked

    @property
    def shape(self) -> tuple[int, int]:
        return self.action.shape

    def starts(self) -> np.ndarray:
        """bool [T, N]: rows that start a transition (not a final obs, successor present)."""
        return _starts(self.terminated | self.truncated)

    def select(self, per_lane: int | None = None) -> np.ndarray:
        """Rows t [M, N] of the first M transition starts of each env (M = the fewest)."""
        ok = self.starts()
        rows = [np.flatnonzero(ok[:, e]) for e in range(self.shape[1])]
        m = min(len(r) for r in rows) if per_lane is None else per_lane
        if any(len(r) < m for r in rows):
            raise ValueError(f"per_lane: some env has fewer than {m} transitions")
        return np.stack([r[:m] for r in rows], axis=1)

    def stack(self, t: np.ndarray, e: np.ndarray) -> np.ndarray:
        """Stacked observations of rows (t, e) [*S] -> uint8 [*S, 4, 84, 84]."""
        back = np.minimum(np.arange(K - 1, -1, -1), self.ep[t, e][..., None])
        return self.frames[t[..., None] - back, e[..., None]]

    def head(self, rows: int) -> Episodes:
        cut = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return Episodes(**{k: v[:rows] if isinstance(v, np.ndarray) else v for k, v in cut.items()})


def _starts(done: np.ndarray) -> np.ndarray:
    """bool [T, N]: rows that are no final obs (the row after a done step) and have a successor."""
    ok = np.ones(done.shape, bool)
    ok[1:] &= ~done[:-1]
    ok[-1] = False
    return ok


def _ep_positions(done: np.ndarray) -> np.ndarray:
    """Episode position of each row [T, N]; the row after a done row is a final obs, the row
    after that starts the next episode at 0."""
    ep = np.zeros(done.shape, np.int64)
    for t in range(1, len(done)):
        new = t >= 2 and done[t - 2]
        ep[t] = np.where(new, 0, ep[t - 1] + 1)
    return ep


def synthetic(per_lane: int, num_envs: int, mean_len: int, seed: int) -> Episodes:
    """Episodes of lengths uniform in [mean/10, 1.9 mean]; as few rows as give every env
    ``per_lane`` transition starts."""
    rng = np.random.default_rng(seed)
    lo = max(2, mean_len // 10)
    t_max = per_lane + per_lane // lo + 4
    term = np.zeros((t_max, num_envs), bool)
    trunc = np.zeros((t_max, num_envs), bool)
    for e in range(num_envs):
        t = 0
        while t < t_max:
            n = int(rng.integers(lo, 2 * mean_len - lo + 1))  # steps; its final obs is row t + n
            if t + n - 1 < t_max:
                (trunc if rng.random() < 0.25 else term)[t + n - 1, e] = True
            t += n + 1
    done = term | trunc
    ok = _starts(done)
    T = 2 + max(int(np.flatnonzero(ok[:, e])[per_lane - 1]) for e in range(num_envs))
    frames = rng.integers(0, 256, (T, num_envs, *FRAME), dtype=np.uint8)
    ids = np.arange(T * num_envs, dtype="<u4").reshape(T, num_envs)
    frames.reshape(T, num_envs, -1)[:, :, :4] = ids[..., None].view(np.uint8)
    reward = rng.standard_normal((T, num_envs), dtype=np.float32)
    reward[1:][done[: T - 1]] = 0.0
    return Episodes(
        frames=frames,
        action=rng.integers(0, 6, (T, num_envs)),
        reward=reward,
        terminated=term[:T],
        truncated=trunc[:T],
        ep=_ep_positions(done[:T]),
        n_actions=6,
        stamped=True,
    )


def collect_pong(frames_total: int, num_envs: int, seed: int, path: Path) -> dict:
    """Collect ``frames_total`` agent steps of Pong (random policy) with rlstash's Collector;
    check every stack against the rebuild from single frames; save the single frames."""
    import ale_py
    import gymnasium as gym
    import torch
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    from rlstash.collect.sync import Collector

    gym.register_envs(ale_py)

    def make() -> gym.Env:
        env = gym.make("ALE/Pong-v5", frameskip=1)
        env = AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30)
        return FrameStackObservation(env, K)

    env = gym.vector.SyncVectorEnv([make for _ in range(num_envs)])
    env.action_space.seed(seed)
    gen = torch.Generator().manual_seed(seed)
    n_act = int(env.single_action_space.n)

    def policy(obs: torch.Tensor) -> torch.Tensor:
        return torch.randint(0, n_act, (obs.shape[0],), generator=gen)

    T = frames_total // num_envs
    per_batch = num_envs * min(T, 250)
    col = Collector(env, policy, per_batch, total_frames=T * num_envs, seed=seed)
    parts: dict[str, list] = {k: [] for k in ("frames", "action", "reward", "term", "trunc")}
    start = time.perf_counter()
    for batch in col:
        obs = batch["obs"].numpy()  # [Tb, N, 4, 84, 84]
        parts["frames"].append(obs[:, :, -1].copy())
        parts["action"].append(batch["action"].numpy().astype(np.int64))
        parts["reward"].append(batch["reward"].numpy())
        parts["term"].append(batch["terminated"].numpy())
        parts["trunc"].append(batch["truncated"].numpy())
        _check_stacks(parts, obs)
    wall = time.perf_counter() - start
    env.close()
    arrays = {k: np.concatenate(v)[:T] for k, v in parts.items()}
    done = arrays["term"] | arrays["trunc"]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, ep=_ep_positions(done), n_actions=n_act, **arrays)
    os.replace(tmp, path)
    meta = {"steps": T * num_envs, "episodes_ended": int(done.sum()), "collect_s": round(wall, 1)}
    path.with_suffix(".json").write_text(json.dumps(meta))
    return meta


def _check_stacks(parts: dict[str, list], obs: np.ndarray) -> None:
    """The env's stacks ``obs`` of the newest batch equal the rebuild from single frames."""
    a = {k: np.concatenate(v) for k, v in parts.items()}
    done = a["term"] | a["trunc"]
    data = Episodes(
        a["frames"], a["action"], a["reward"], a["term"], a["trunc"], _ep_positions(done), 0, False
    )
    T, N = data.shape
    t, e = np.meshgrid(np.arange(T - len(obs), T), np.arange(N), indexing="ij")
    if not np.array_equal(data.stack(t, e), obs):
        raise RuntimeError("FrameStackObservation stacks differ from the single-frame rebuild")


def load_data(task: dict) -> Episodes:
    """The workload's episodes: W2 generated (seeded), Pong read from the cache."""
    if task["workload"] == "W2":
        return synthetic(task["capacity"] // NUM_ENVS, NUM_ENVS, task["mean_len"], seed=0)
    with np.load(task["data"]) as z:
        return Episodes(
            z["frames"], z["action"], z["reward"], z["term"], z["trunc"], z["ep"],
            int(z["n_actions"]), False,
        )  # fmt: skip


# ----------------------------------------------------------------------------- buffers


class Peer:
    """One buffer filled with the transitions ``sel`` (rows t [M, N]) of ``data``."""

    label = ""

    def __init__(self, data: Episodes, sel: np.ndarray, chunk: int = 256) -> None:
        self.data, self.sel, self.chunk = data, sel, chunk
        self.capacity = sel.size  # transitions

    def chunks(self):
        """Transitions as a collector yields them: [C, N] time-major blocks of ``sel``."""
        M, N = self.sel.shape
        for k0 in range(0, M, self.chunk):
            t = self.sel[k0 : k0 + self.chunk]
            yield t, np.broadcast_to(np.arange(N), t.shape)

    def sample(self) -> object:
        raise NotImplementedError

    def checked(self, out: object) -> tuple:
        """(obs [B, 4, 84, 84], next_obs, rows whose next obs must match) of a sample."""
        raise NotImplementedError

    def transitions(self) -> int:
        return self.capacity


class Rlstash(Peer):
    """StreamStorage: W2 single frames + frame_stack=4; Pong the env's stacks (stacked_input)."""

    label = "rlstash StreamStorage"

    def __init__(self, data: Episodes, sel: np.ndarray, stacked: bool) -> None:
        super().__init__(data, sel)
        import torch

        from rlstash.replay import ReplayBuffer
        from rlstash.spec import Field
        from rlstash.storage.stream import ReadSpec, StreamStorage

        T, N = data.shape
        shape = (K, *FRAME) if stacked else FRAME
        spec = {"obs": Field(shape, torch.uint8), "action": Field((), torch.int64)}
        self.store = StreamStorage(
            spec, N, T * N, reads=ReadSpec(1, 0.99, K), stacked_input=stacked
        )
        self.rb = ReplayBuffer(self.store, seed=0)
        t = torch.from_numpy
        for t0 in range(0, T, self.chunk):
            rows = np.arange(t0, min(T, t0 + self.chunk))
            if stacked:
                obs = data.stack(*np.meshgrid(rows, np.arange(N), indexing="ij"))
            else:
                obs = data.frames[rows]
            self.rb.extend(
                {
                    "obs": t(obs),
                    "action": t(data.action[rows]),
                    "reward": t(data.reward[rows]),
                    "terminated": t(data.terminated[rows]),
                    "truncated": t(data.truncated[rows]),
                }
            )
        self.stored = self.store.nbytes
        if stacked:
            self.label += " (stacked_input=True)"
        else:
            self.label += " (frame_stack=4)"

    def sample(self) -> object:
        return self.rb.sample(BATCH)

    def checked(self, out: dict) -> tuple:
        return out["obs"].numpy(), out["next_obs"].numpy(), np.ones(BATCH, bool)

    def transitions(self) -> int:
        return int(self.store.valid.sum())


class TorchRLStacked(Peer):
    """ReplayBuffer + LazyTensorStorage of transitions with stacked obs and next obs."""

    label = "TorchRL LazyTensorStorage (stacked obs + next obs)"

    def __init__(self, data: Episodes, sel: np.ndarray) -> None:
        super().__init__(data, sel)
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, ReplayBuffer

        self.rb = ReplayBuffer(storage=LazyTensorStorage(self.capacity), batch_size=BATCH)
        for t, e in self.chunks():
            self.rb.extend(self._td(TensorDict, t.T.reshape(-1), e.T.reshape(-1)))
        self.stored = sum(v.nbytes for v in self.rb.storage._storage.values(True, True))

    def _td(self, TensorDict: type, t: np.ndarray, e: np.ndarray) -> object:
        """Env-major rows (a TorchRL collector's [N, C] batch reshaped to -1)."""
        import torch

        d, f = self.data, torch.from_numpy
        n = len(t)
        nxt = {
            "pixels": f(d.stack(t + 1, e)),
            "reward": f(d.reward[t, e])[:, None],
            "done": f(d.terminated[t, e] | d.truncated[t, e])[:, None],
            "terminated": f(d.terminated[t, e])[:, None],
            "truncated": f(d.truncated[t, e])[:, None],
        }
        return TensorDict(
            {"pixels": f(d.stack(t, e)), "action": f(d.action[t, e]), "next": nxt}, [n]
        )

    def sample(self) -> object:
        return self.rb.sample()

    def checked(self, out: object) -> tuple:
        return out["pixels"].numpy(), out["next", "pixels"].numpy(), np.ones(BATCH, bool)


class TorchRLCatFrames(TorchRLStacked):
    """TorchRL's memory saving: single frames stored (``pixels`` and ``("next", "pixels")``),
    stacked on sampling by CatFrames over 4-step slices (``make_rb_transform_and_sampler``)."""

    label = "TorchRL CatFrames + SliceSampler (single frames + next frames)"

    def __init__(self, data: Episodes, sel: np.ndarray) -> None:
        Peer.__init__(self, data, sel)
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, ReplayBuffer
        from torchrl.envs import CatFrames

        cat = CatFrames(N=K, dim=-3, in_keys=["pixels"], out_keys=["stack"], reset_key="_reset")
        transform, sampler = cat.make_rb_transform_and_sampler(
            batch_size=BATCH, traj_key="episode", strict_length=True, cache_values=True
        )
        self.rb = ReplayBuffer(
            storage=LazyTensorStorage(self.capacity),
            sampler=sampler,
            transform=transform,
            batch_size=BATCH,
        )
        T, N = data.shape
        self.episode = np.cumsum(data.ep == 0, axis=0) + np.arange(N) * T  # unique per env
        for t, e in self.chunks():
            self.rb.extend(self._td(TensorDict, t.T.reshape(-1), e.T.reshape(-1)))
        self.stored = sum(v.nbytes for v in self.rb.storage._storage.values(True, True))

    def _td(self, TensorDict: type, t: np.ndarray, e: np.ndarray) -> object:
        import torch

        d, f = self.data, torch.from_numpy
        nxt = {
            "pixels": f(d.frames[t + 1, e])[:, None],  # [n, 1, 84, 84]
            "reward": f(d.reward[t, e])[:, None],
            "done": f(d.terminated[t, e] | d.truncated[t, e])[:, None],
            "terminated": f(d.terminated[t, e])[:, None],
            "truncated": f(d.truncated[t, e])[:, None],
        }
        root = {
            "pixels": f(d.frames[t, e])[:, None],
            "action": f(d.action[t, e]),
            "episode": f(self.episode[t, e]),
            "next": nxt,
        }
        return TensorDict(root, [len(t)])

    def checked(self, out: object) -> tuple:
        return out["stack"].numpy(), out["next", "stack"].numpy(), np.ones(BATCH, bool)


class SB3(Peer):
    """Stable-Baselines3 ReplayBuffer, n_envs=N, fed with ``add`` (one row per env per call).

    optimize_memory_usage=True stores obs only and reads next obs from the next slot (so the
    next obs of an episode's last transition is the next episode's first obs); it cannot be
    combined with handle_timeout_termination, so truncations count as terminations there.
    """

    def __init__(self, data: Episodes, sel: np.ndarray, optimize: bool) -> None:
        super().__init__(data, sel)
        import gymnasium as gym
        from stable_baselines3.common.buffers import ReplayBuffer

        M, N = sel.shape
        self.optimize = optimize
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.rb = ReplayBuffer(
                self.capacity,
                gym.spaces.Box(0, 255, (K, *FRAME), np.uint8),
                gym.spaces.Discrete(data.n_actions),
                device="cpu",
                n_envs=N,
                optimize_memory_usage=optimize,
                handle_timeout_termination=not optimize,
            )
        d = data
        for t, e in self.chunks():
            obs, nxt = d.stack(t, e), d.stack(t + 1, e)  # [C, N, 4, 84, 84]
            for i in range(len(t)):
                ti, ei = t[i], e[i]
                trunc = d.truncated[ti, ei]
                infos = [{"TimeLimit.truncated": bool(x)} for x in trunc]
                done = (d.terminated[ti, ei] | trunc).astype(np.float32)
                self.rb.add(obs[i], nxt[i], d.action[ti, ei], d.reward[ti, ei], done, infos)
        names = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")
        self.stored = sum(getattr(self.rb, n).nbytes for n in names if hasattr(self.rb, n))
        self.label = f"Stable-Baselines3 ReplayBuffer (optimize_memory_usage={optimize})"

    def sample(self) -> object:
        return self.rb.sample(BATCH)

    def checked(self, out: object) -> tuple:
        must = np.ones(BATCH, bool)
        if self.optimize:  # an episode's last transition reads the next episode's first obs
            must = out.dones.numpy()[:, 0] == 0
        return out.observations.numpy(), out.next_observations.numpy(), must


def build(key: str, data: Episodes, sel: np.ndarray, workload: str) -> Peer:
    if key == "rlstash":
        return Rlstash(data, sel, stacked=workload == "pong")
    if key == "torchrl-stacked":
        return TorchRLStacked(data, sel)
    if key == "torchrl-catframes":
        return TorchRLCatFrames(data, sel)
    if key in ("sb3", "sb3-optimized"):
        return SB3(data, sel, optimize=key == "sb3-optimized")
    raise ValueError(f"peer: expected one of {', '.join(PEERS)}, got {key!r}")


def check_sample(peer: Peer, data: Episodes, draws: int = 3) -> bool:
    """Every sampled obs/next obs stack equals the stack of its row: rows from the frame ids
    (stamped frames) or from rlstash's returned slot index; False when neither is there."""
    if not data.stamped and not isinstance(peer, Rlstash):
        return False
    T, N = data.shape
    for _ in range(draws):
        out = peer.sample()
        obs, nxt, must = peer.checked(out)
        if data.stamped:
            ids = np.ascontiguousarray(obs[:, -1].reshape(len(obs), -1)[:, :4]).view("<u4")
            t, e = ids[:, 0] // N, ids[:, 0] % N
        else:  # slot-major rows: env e's lane position t (T slots, no wrap) at row t * N + e
            t, e = out["index"].numpy() // N, out["index"].numpy() % N
        if not np.array_equal(obs, data.stack(t, e)):
            raise RuntimeError(f"{peer.label}: sampled obs stacks differ from the data")
        if not np.array_equal(nxt[must], data.stack(t + 1, e)[must]):
            raise RuntimeError(f"{peer.label}: sampled next obs stacks differ from the data")
    return True


def nbytes(obj: object) -> int:
    """Bytes of every tensor/array in a sample (dict, TensorDict, named tuple)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if hasattr(obj, "values") and callable(obj.values):
        try:
            return sum(nbytes(v) for v in obj.values(include_nested=True, leaves_only=True))
        except TypeError:
            return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, tuple | list):
        return sum(nbytes(v) for v in obj)
    return 0


# ----------------------------------------------------------------------------- workers


def _setup_worker(task: dict) -> None:
    """Quiet TorchRL's logging and warnings; set torch's intra-op threads for every buffer."""
    import logging

    import torch

    logging.getLogger("torchrl").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(task["torch_threads"])


def _rss_worker(task: dict) -> dict:
    """RSS increase of one buffer built, filled and sampled once in this fresh process."""
    from common import rss_parts
    from replay import _malloc_trim

    _setup_worker(task)
    data = load_data(task)
    sel = data.select(task.get("per_lane"))
    key = task["peers"][0]
    tiny = data.head(64)
    warm = build(key, tiny, tiny.select(), task["workload"])
    warm.sample()
    del warm
    gc.collect()
    _malloc_trim()
    before = rss_parts()
    peer = build(key, data, sel, task["workload"])
    peer.sample()
    gc.collect()
    _malloc_trim()  # count what the buffer holds, not the allocator's free lists
    after = rss_parts()
    return {
        "label": peer.label,
        "rss": after["total"] - before["total"],
        "anon": after["anon"] - before["anon"],
        "stored": peer.stored,
        "transitions": peer.transitions(),
    }


def _time_worker(task: dict) -> dict:
    """Build every buffer of the group, check samples, time them interleaved."""
    from common import cpu_meter, gc_paused, interleaved
    from replay import _cpu

    _setup_worker(task)
    data = load_data(task)
    sel = data.select(task.get("per_lane"))
    runs, out = {}, {"peers": {}, "errors": {}}
    cpu_log: dict[str, list[tuple[int, float]]] = {}  # key -> (n, thread CPU s) per call
    for key in task["peers"]:
        try:
            start = time.perf_counter()
            peer = build(key, data, sel, task["workload"])
            fill_s = time.perf_counter() - start
            checked = check_sample(peer, data)
        except Exception as exc:  # reported in the table and in the exit code
            traceback.print_exc()
            out["errors"][key] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            continue

        runs[key] = _timed_run(peer.sample, cpu_log.setdefault(key, []))
        out["peers"][key] = {
            "label": peer.label,
            "returned": nbytes(peer.sample()),
            "fill_s": round(fill_s, 2),
            "checked": checked,
        }
        print(f"[stream] {task['workload']}: built {key}", file=sys.stderr, flush=True)
    if runs:
        with gc_paused(), cpu_meter() as meter:
            timings = interleaved(runs, task["reps"], task["target_s"])
        out["cpu"] = _cpu(meter)
        for key, t in timings.items():
            cpu_rates = [n / max(c, 1e-9) for n, c in cpu_log[key][-task["reps"] :]]
            out["peers"][key].update(median=t.median, rates=t.rates, spread=t.spread)
            out["peers"][key]["cpu_median"] = float(np.median(cpu_rates))
    return out


def _timed_run(sample: Callable[[], object], log: list) -> Callable[[int], None]:
    """``run(n)``: n samples; logs (n, CPU seconds of this thread) of every call."""

    def run(n: int) -> None:
        c0 = time.thread_time()
        for _ in range(n):
            sample()
        log.append((n, time.thread_time() - c0))

    return run


def _worker_main(task: dict) -> int:
    if task["mode"] == "collect":
        result = collect_pong(task["frames"], NUM_ENVS, task["seed"], Path(task["data"]))
    elif task["mode"] == "rss":
        result = _rss_worker(task)
    else:
        result = _time_worker(task)
    Path(task["result"]).write_text(json.dumps(result))
    return 0


# ----------------------------------------------------------------------------- orchestration


def _spawn(task: dict, timeout_s: float) -> dict:
    """One worker in a fresh process: its result, or {"error": why}."""
    WORK.mkdir(parents=True, exist_ok=True)
    fd, result = tempfile.mkstemp(prefix="result-", suffix=".json", dir=WORK)
    os.close(fd)
    task = dict(task, result=result)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(task)]
    try:
        proc = subprocess.run(cmd, timeout=timeout_s, check=False)
        text = Path(result).read_text() if proc.returncode == 0 else ""
        return json.loads(text) if text else {"error": f"worker exited with {proc.returncode}"}
    except subprocess.TimeoutExpired:
        return {"error": f"worker timed out after {timeout_s:.0f} s"}
    finally:
        Path(result).unlink(missing_ok=True)


def per_transition_bytes(key: str) -> int:
    """Approximate stored bytes per transition of each buffer (for grouping only)."""
    stack = K * FRAME_BYTES
    return {
        "rlstash": FRAME_BYTES + 16,
        "torchrl-stacked": 2 * stack + 16,
        "torchrl-catframes": 2 * FRAME_BYTES + 24,
        "sb3": 2 * stack + 24,
        "sb3-optimized": stack + 24,
    }[key]


def groups(keys: list[str], transitions: int, budget: int) -> list[list[str]]:
    """rlstash plus as many peers as fit in ``budget`` bytes per group (largest first)."""
    anchor = "rlstash" if "rlstash" in keys else None
    base = (2 if anchor else 1) * per_transition_bytes("rlstash") * transitions  # + the data
    left = sorted((k for k in keys if k != anchor), key=per_transition_bytes, reverse=True)
    out: list[list[str]] = []
    while left:
        group, used = [], base
        for k in list(left):
            need = per_transition_bytes(k) * transitions * 1.1
            if not group or used + need <= budget:
                group.append(k)
                used += need
                left.remove(k)
        out.append(([anchor] if anchor else []) + group)
    return out or [[anchor]]


def _pong_data(args: argparse.Namespace) -> tuple[Path, dict]:
    path = CACHE / f"pong-{args.pong_frames}-{NUM_ENVS}envs-seed0.npz"
    meta = path.with_suffix(".json")
    info = {"cached": path.exists() and meta.exists() and not args.recollect}
    if info["cached"]:
        info.update(json.loads(meta.read_text()))
    else:
        print(f"[stream] collecting {args.pong_frames:,} Pong steps", flush=True)
        task = {"mode": "collect", "frames": args.pong_frames, "seed": 0, "data": str(path)}
        res = _spawn(task, args.timeout)
        if "error" in res:
            raise RuntimeError(f"Pong collection failed: {res['error']}")
        info.update(res)
    return path, info


def run_all(args: argparse.Namespace) -> dict:
    import psutil
    from common import wait_quiet

    budget = min(args.budget_gb << 30, psutil.virtual_memory().available // 2)
    results: dict = {}
    for name in args.workloads:
        base = {"workload": name, "reps": args.reps, "target_s": args.target_s}
        base["torch_threads"] = args.torch_threads
        res: dict = {"time": [], "rss": {}}
        if name == "W2":
            base.update(capacity=args.capacity, mean_len=args.mean_len)
            base["per_lane"] = args.capacity // NUM_ENVS
            transitions = args.capacity
        else:
            path, res["collect"] = _pong_data(args)
            base["data"], transitions = str(path), args.pong_frames
        for group in groups(args.peers, transitions, budget):
            print(f"[stream] {name}: timing {', '.join(group)}", flush=True)
            wait_quiet(args.wait_quiet, "stream")
            out = _spawn(dict(base, mode="time", peers=group), args.timeout)
            if "error" in out:
                out = {"peers": {}, "errors": dict.fromkeys(group, out["error"])}
            res["time"].append(out)
        for key in args.peers:
            print(f"[stream] {name}: memory of {key}", flush=True)
            res["rss"][key] = _spawn(dict(base, mode="rss", peers=[key]), args.timeout)
        results[name] = res
    return results


# ----------------------------------------------------------------------------- report


def _fmt(x: float | None, spec: str = ".2f", suffix: str = "x") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:{spec}}{suffix}"


def summarize(res: dict) -> dict:
    """Per buffer: memory, throughput and the ratios rlstash / buffer (throughput: measured
    in the same process; memory: per transition held)."""
    rows: dict = {}
    for group in res["time"]:
        mine = group["peers"].get("rlstash", {}).get("median")
        mine_cpu = group["peers"].get("rlstash", {}).get("cpu_median")
        for key, p in group["peers"].items():
            row = rows.setdefault(key, {"label": p["label"]})
            if key == "rlstash" and "median" in row:
                continue  # the first group's rlstash figures are shown
            row.update(p, cpu=group.get("cpu"))
            if key != "rlstash" and mine and p.get("median"):
                row["speedup"] = mine / p["median"]
                row["cpu_speedup"] = mine_cpu / p["cpu_median"]
        for key, err in group.get("errors", {}).items():
            rows.setdefault(key, {"label": key})["error"] = err
    for key, r in res["rss"].items():
        row = rows.setdefault(key, {"label": r.get("label", key)})
        if "error" in r:
            row.setdefault("error", r["error"])
        else:
            row.update(rss=r["rss"], anon=r["anon"], stored=r["stored"], trans=r["transitions"])
    mine = rows.get("rlstash", {})
    for key, row in rows.items():
        if key != "rlstash" and row.get("rss") and mine.get("rss"):
            row["mem_ratio"] = (mine["rss"] / mine["trans"]) / (row["rss"] / row["trans"])
    return rows


def render(results: dict, info: dict, args: argparse.Namespace) -> tuple[str, list[str]]:
    from common import fmt_bytes, fmt_rate, header_lines, markdown_table

    lines = ["# Stream-storage benchmark (issue 3)", "", "## Machine", "", *header_lines(info)]
    lines += ["", "## Method", "", *_method(args)]
    goal_rows, body, failed = [], [], []
    for name, res in results.items():
        rows = summarize(res)
        failed += [f"{name}/{k}" for k, r in rows.items() if "error" in r]
        title = _title(name, args, res)
        table = []
        for key in [k for k in PEERS if k in rows]:
            r = rows[key]
            trans = r.get("trans")
            table.append(
                [
                    r["label"],
                    f"{trans:,}" if trans else "—",
                    fmt_bytes(r.get("stored")),
                    f"{r['stored'] / trans:,.0f}" if trans else "—",
                    fmt_bytes(r.get("rss")),
                    f"{r['rss'] / trans:,.0f}" if trans else "—",
                    "1.00x" if key == "rlstash" else _fmt(r.get("mem_ratio")),
                    fmt_rate(r.get("median")),
                    "1.00x" if key == "rlstash" else _fmt(r.get("speedup")),
                    fmt_rate(r.get("cpu_median")),
                    "1.00x" if key == "rlstash" else _fmt(r.get("cpu_speedup")),
                    f"{r['returned']:,}" if "returned" in r else "—",
                    _fmt(100 * r["spread"], ".0f", "%") if "spread" in r else "—",
                    r.get("error", "checked" if r.get("checked") else "not checked (real frames)"),
                ]
            )
        headers = [
            "buffer", "transitions", "stored", "stored B/transition", "RSS increase",
            "RSS B/transition", "rlstash RSS/transition ÷ this", "batches/s",
            "rlstash batches/s ÷ this (same process)", "batches per CPU-s",
            "rlstash ÷ this (CPU time)", "bytes returned", "spread", "samples",
        ]  # fmt: skip
        body += ["", f"## {title}", "", markdown_table(headers, table), ""]
        body += _cpu_lines(res) + _notes(name, res)
        goal_rows += _goals(name, rows)
    goals = markdown_table(["workload", "goal", "target", "measured", "result"], goal_rows)
    lines += ["", "## Goals", "", goals, *body]
    return "\n".join(lines) + "\n", failed


def _title(name: str, args: argparse.Namespace, res: dict) -> str:
    if name == "W2":
        return (
            f"W2: {args.capacity:,} transitions, 4x84x84 uint8 stacks, {NUM_ENVS} envs, "
            f"episodes of mean {args.mean_len} steps, batch {BATCH}"
        )
    c = res.get("collect", {})
    how = (
        "cached from an earlier run" if c.get("cached") else f"collected in {c.get('collect_s')} s"
    )
    return (
        f"ALE/Pong-v5: {args.pong_frames:,} agent steps ({NUM_ENVS} envs, random policy, "
        f"AtariPreprocessing + FrameStackObservation(4); {how}), batch {BATCH}"
    )


def _best(rows: dict, key: str, best: str) -> tuple[str | None, float | None]:
    """The peer (not rlstash) with the best value of ``key`` (``best`` = 'min' or 'max')."""
    vals = {k: r[key] for k, r in rows.items() if k != "rlstash" and r.get(key)}
    if not vals:
        return None, None
    pick = (min if best == "min" else max)(vals, key=vals.get)
    return pick, vals[pick]


def _goals(name: str, rows: dict) -> list[list[str]]:
    out = []
    peer, ratio = _best(rows, "mem_ratio", "max")  # largest ratio = the leanest peer
    if peer:
        ok = "PASS" if ratio <= 0.3 else "FAIL"
        out.append([name, f"RSS per transition vs the leanest peer ({peer})", "<= 0.30x",
                    _fmt(ratio), ok])  # fmt: skip
    peer, ratio = _best(rows, "speedup", "min")  # smallest speedup = the fastest peer
    if peer:
        ok = "PASS" if ratio >= 1.0 else "FAIL"
        cpu = _fmt(rows[peer].get("cpu_speedup"))
        out.append([name, f"sample throughput vs the fastest peer ({peer}), wall-time medians",
                    ">= 1.00x", f"{_fmt(ratio)} (CPU time: {cpu})", ok])  # fmt: skip
    stacked = {k: r for k, r in rows.items() if k not in ("rlstash", "torchrl-catframes")}
    peer, ratio = _best(stacked, "mem_ratio", "max")
    if peer:
        out.append([name, f"(not a goal) RSS per transition vs the leanest peer storing "
                    f"frame stacks ({peer})", "<= 0.30x", _fmt(ratio),
                    "pass" if ratio <= 0.3 else "fail"])  # fmt: skip
    mine, naive = rows.get("rlstash", {}), rows.get("torchrl-stacked", {})
    if mine.get("stored") and naive.get("stored"):
        r = (mine["stored"] / mine["trans"]) / (naive["stored"] / naive["trans"])
        out.append([name, "stored bytes per transition vs a naive obs + next_obs buffer "
                    "(TorchRL stacked)", "<= 0.14x", _fmt(r, ".3f"),
                    "PASS" if r <= 0.14 else "FAIL"])  # fmt: skip
    return out


def _cpu_lines(res: dict) -> list[str]:
    out = []
    for g in res["time"]:
        c = g.get("cpu")
        if c:
            names = ", ".join(g["peers"])
            out.append(
                f"- CPU cores busy while timing {names}: {c['machine']:.2f} of 2 (this "
                f"benchmark {c['own']:.2f}, other users {c['others']:.2f}) over {c['wall_s']:.0f} s"
            )
    return out


def _notes(name: str, res: dict) -> list[str]:
    if name != "pong":
        return []
    c = res.get("collect", {})
    if "episodes_ended" not in c:
        return ["- Data: the cached collection of an earlier run (same settings, same seed)."]
    return [f"- Collection: {c['steps']:,} steps, {c['episodes_ended']} episodes ended, "
            f"{c['collect_s']} s (stacks checked against the single-frame rebuild)."]  # fmt: skip


def _method(args: argparse.Namespace) -> list[str]:
    cmd = "python3 bench/stream.py" + (" --quick" if args.quick else "")
    return [
        f"- Command: `{cmd}`; {args.reps} interleaved repetitions of ~{args.target_s} s per "
        "buffer, medians of wall-time rates (the goal); 'spread' = (max - min) / median of "
        "them. 'batches per CPU-s': the same repetitions divided by the CPU time of the "
        "sampling thread (torch runs 1 intra-op thread), less sensitive to other users' load. "
        "Python's cyclic GC is off while timing (as in timeit): a collection triggered by "
        "one library's garbage would otherwise pause whichever buffer runs next.",
        "- Every buffer holds the same transitions: the first M of each of the 8 envs (M = "
        "capacity / 8 for W2, the fewest any env has for Pong), fed the way each library's "
        "users feed it (rlstash: `extend` of [T, N] collector chunks with next-step autoreset; "
        "TorchRL: TensorDicts of a collector's [N, C] batch reshaped to -1; SB3: `add` with "
        "n_envs=8). The stream holds every row of the same stretch of steps (it cannot skip "
        "steps), so it holds at least as many transitions; memory is compared per transition.",
        "- Memory: a fresh process per buffer loads the data, builds and samples a tiny copy "
        "(imports, code pages, first-use caches), runs malloc_trim, then builds, fills and "
        "samples the buffer and runs malloc_trim again (memory freed but kept by the C "
        "allocator is not counted); 'RSS increase' is the difference (psutil). 'stored' counts "
        "the buffer's own arrays (for rlstash: frames, action, reward + 3 bookkeeping bytes "
        "per slot).",
        "- Throughput: the buffers of a group are built in one fresh process and timed "
        "interleaved; groups (rlstash + the peers that fit in memory together) share the "
        "rlstash buffer, so each ratio comes from one process. Before timing, 3 samples of "
        "every buffer are checked against the data ('samples' column): in W2 every frame "
        "carries its row id; on Pong only rlstash is checked (through its slot index).",
        "- TorchRL CatFrames: `CatFrames(N=4, dim=-3, in_keys=['pixels'], out_keys=['stack'])"
        ".make_rb_transform_and_sampler(batch_size=32, traj_key='episode', strict_length=True, "
        "cache_values=True)` with a LazyTensorStorage, as TorchRL documents for frame stacks: "
        "it stores single frames for `pixels` and `('next', 'pixels')` (2 frames per "
        "transition), samples 32 slices of 4 steps and stacks them; the first 3 steps of each "
        "stored run are never sampled; cache_values keeps the episode boundaries while nothing "
        "is written (favourable to TorchRL: in training each write clears it).",
        "- SB3 optimize_memory_usage=True stores one stack per transition and reads next obs "
        "from the next slot: at an episode end that is the next episode's first obs (masked by "
        "done for terminations, wrong for truncations: it cannot be combined with "
        "handle_timeout_termination). rlstash stores each frame once and keeps final "
        "observations in a slot of their own.",
        "- Single run on a shared 2-core machine: ratios from one process are the result; the "
        "cores used by other users during each timing are printed under each table.",
    ]


# ----------------------------------------------------------------------------- CLI


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    p.add_argument("--workloads", default="W2,pong", help="comma list of W2,pong")
    p.add_argument("--peers", default=",".join(PEERS), help="comma list of " + ",".join(PEERS))
    p.add_argument("--reps", type=int, default=None, help="interleaved repetitions (>= 5)")
    p.add_argument("--target-s", type=float, default=None, help="seconds per repetition")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per worker process")
    p.add_argument("--wait-quiet", type=float, default=None, help="max s to wait for quiet")
    p.add_argument("--budget-gb", type=int, default=8, help="memory per timing group")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads in the workers (default 1: on a busy shared machine a "
        "second OpenMP thread makes every torch copy wait for a core)",
    )
    p.add_argument("--recollect", action="store_true", help="collect Pong again")
    p.add_argument("--out", default=str(HERE / "results" / "stream.md"), help="markdown output")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return args
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    args.peers = [k.strip() for k in args.peers.split(",") if k.strip()]
    for w in args.workloads:
        if w not in ("W2", "pong"):
            p.error(f"--workloads: expected names from W2,pong, got {w!r}")
    for k in args.peers:
        if k not in PEERS:
            p.error(f"--peers: expected names from {','.join(PEERS)}, got {k!r}")
    args.reps = args.reps or (5 if args.quick else 15)
    if args.reps < 5:
        p.error(f"--reps: expected >= 5 interleaved repetitions, got {args.reps}")
    if args.target_s is None:
        args.target_s = 0.05 if args.quick else 0.3
    if args.wait_quiet is None:
        args.wait_quiet = 0.0 if args.quick else 60.0
    args.capacity, args.mean_len = (4_000, 100) if args.quick else (100_000, 500)
    args.pong_frames = 2_000 if args.quick else 50_000
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.worker:
        return _worker_main(json.loads(args.worker))
    from common import machine_info, publish, timed_run

    info = machine_info()
    info["torch_threads"] = f"{args.torch_threads} in every worker (--torch-threads)"
    try:
        results = timed_run(lambda: run_all(args), info)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    text, failed = render(results, info, args)
    return publish(text, args.out, "stream", failed)


if __name__ == "__main__":
    from bench_venv import ensure_bench_venv

    ensure_bench_venv(__file__)
    sys.exit(main())
