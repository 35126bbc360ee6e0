"""``rlstash bench``: a short measurement of this machine, to size workers and batch sizes.

Three questions a user sizing a run asks, each answered in about a second of timing:

- replay: how many rows/s can the buffer take in (``extend``) and hand out (``sample``) for
  this spec, capacity and batch size?
- collection: how many env steps/s does the process pool give for this env with N envs and
  W workers (one row per worker count asked for)?
- learning: how many updates/s does the agent make at this batch size, on this device?

and the summary says which one bounds a run of the algorithm's update schedule
(``gradient_steps`` updates per ``train_freq`` env steps)::

    rows = measure(BenchOptions(env="CartPole-v1", envs=8, workers=(0, 2), batch_size=256))
    print(format_table(rows))

Each rate is the median of a few timed repeats after a warm-up, so a busy machine shows as a
wide spread (``spread`` = (max - min) / median), not as a wrong number.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rlstash.spec import Spec


@dataclass
class BenchOptions:
    """What to measure (the ``rlstash bench`` flags)."""

    env: str = "CartPole-v1"
    envs: int = 8
    workers: tuple[int | str, ...] = (0, 2)
    batch_size: int = 256
    algo: str = "dqn"
    capacity: int = 100_000
    chunk: int = 256  # rows per extend
    storage: str = "ram"
    device: str = "cpu"
    seconds: float = 1.0  # timing per measurement
    spec: Spec | None = None  # default: the env's transitions

    def __post_init__(self) -> None:
        for name, value in (
            ("envs", self.envs),
            ("batch_size", self.batch_size),
            ("capacity", self.capacity),
            ("chunk", self.chunk),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}; give 1 or more")
        if not self.seconds > 0:
            raise ValueError(f"seconds: expected > 0, got {self.seconds!r}; e.g. 1.0")
        if self.storage not in ("ram", "disk"):
            raise ValueError(f"storage: expected ram or disk, got {self.storage!r}")
        if self.batch_size > self.capacity:
            raise ValueError(
                f"batch_size: {self.batch_size} rows cannot be sampled from a capacity of "
                f"{self.capacity}; lower --batch-size or raise --capacity"
            )
        for w in self.workers:
            if w != "auto" and (isinstance(w, bool) or not isinstance(w, int) or w < 0):
                raise ValueError(f"workers: expected ints >= 0 or 'auto', got {w!r}")


@dataclass
class BenchRow:
    """One measured rate."""

    what: str  # e.g. "replay sample"
    setting: str  # what was measured, e.g. "batch 256, 4 fields, 41 B/row"
    rate: float  # per second
    unit: str  # e.g. "rows/s"
    spread: float = 0.0  # (max - min) / median of the repeats
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def timed_rate(op: Callable[[], int], seconds: float, repeats: int = 3) -> tuple[float, float]:
    """(median units/s, spread) of ``op`` (returns the units it did) over ``repeats`` timed
    windows of ``seconds / repeats`` each, after one warm-up call."""
    op()
    rates = []
    for _ in range(repeats):
        done, start = 0, time.perf_counter()
        while True:
            done += op()
            elapsed = time.perf_counter() - start
            if elapsed >= seconds / repeats:
                break
        rates.append(done / elapsed)
    median = statistics.median(rates)
    return median, (max(rates) - min(rates)) / median if median else 0.0


def random_rows(spec: Spec, n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """``n`` rows of random values for every field of ``spec`` (CPU tensors)."""
    out = {}
    for name, f in spec.items():
        shape = (n, *f.shape)
        if f.dtype == torch.bool:
            out[name] = torch.rand(shape, generator=gen) < 0.01
        elif f.dtype.is_floating_point:
            out[name] = torch.randn(shape, generator=gen).to(f.dtype)
        else:
            out[name] = torch.randint(0, 2, shape, generator=gen).to(f.dtype)
    return out


def env_spec(env_id: str) -> Spec:
    """The transitions spec (obs, action, reward, flags, next_obs) of a gymnasium env."""
    from rlstash.train.builders import probe_env

    info = probe_env(env_id)
    return Spec.for_transitions(info.obs_space, info.act_space, next_obs=True)


def replay_rates(opts: BenchOptions, spec: Spec) -> list[BenchRow]:
    """Extend rate (rows/s, chunks of ``opts.chunk``) and sample rate (rows/s at
    ``opts.batch_size``) of a uniform replay buffer on ``opts.storage``."""
    from rlstash.replay import ReplayBuffer
    from rlstash.storage import MemmapStorage, TensorStorage

    tmp = tempfile.mkdtemp(prefix="rlstash-bench-") if opts.storage == "disk" else None
    try:
        if tmp is not None:
            storage: Any = MemmapStorage(spec, opts.capacity, tmp)
        else:
            storage = TensorStorage(spec, opts.capacity)
        rb = ReplayBuffer(storage, seed=0, device=opts.device)
        try:
            chunk = random_rows(
                spec, min(opts.chunk, opts.capacity), torch.Generator().manual_seed(0)
            )
            n = next(iter(chunk.values())).shape[0]

            def extend() -> int:
                rb.extend(chunk)
                return n

            row_bytes = sum(f.row_bytes for f in spec.values())
            where = f"{opts.storage}, {len(spec)} fields, {row_bytes:,} B/row"
            rate, spread = timed_rate(extend, opts.seconds)
            rows = [BenchRow("replay extend", f"chunks of {n} rows, {where}", rate, "rows/s", spread,
                             f"{rate * row_bytes / 2**20:,.0f} MiB/s")]  # fmt: skip
            while len(rb) < opts.batch_size:
                rb.extend(chunk)

            def sample() -> int:
                rb.sample(opts.batch_size)
                return opts.batch_size

            rate, spread = timed_rate(sample, opts.seconds)
            to = f" to {opts.device}" if opts.device != "cpu" else ""
            rows.append(BenchRow("replay sample", f"batch {opts.batch_size}{to}, {len(rb):,} rows stored",
                                 rate, "rows/s", spread, f"{rate / opts.batch_size:,.0f} batches/s"))  # fmt: skip
            return rows
        finally:
            rb.close()
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def pool_rate(opts: BenchOptions, workers: int | str) -> BenchRow:
    """Env steps/s of a ProcessPoolVectorEnv of ``opts.envs`` envs on ``workers`` workers,
    random actions (start-up time in the note)."""
    from rlstash.envs import ProcessPoolVectorEnv

    start = time.perf_counter()
    pool = ProcessPoolVectorEnv(opts.env, num_envs=opts.envs, num_workers=workers, seed=0)
    try:
        pool.reset(seed=0)
        started = time.perf_counter() - start
        pool.action_space.seed(0)
        actions = [pool.action_space.sample() for _ in range(16)]
        i = 0

        def step() -> int:
            nonlocal i
            pool.step(actions[i % len(actions)])
            i += 1
            return opts.envs

        rate, spread = timed_rate(step, opts.seconds)
        used = len(pool.worker_pids) if workers != 0 else 0
    finally:
        pool.close()
    label = f"{opts.env}, {opts.envs} envs, workers={workers}"
    if workers == "auto":
        label += f" (chose {used})"
    return BenchRow("env steps", label, rate, "steps/s", spread, f"start {started:.1f} s",
                    {"workers": used})  # fmt: skip


def update_rate(opts: BenchOptions) -> BenchRow:
    """Updates/s of ``opts.algo``'s agent (its preset for ``opts.env``) at ``opts.batch_size``
    on ``opts.device``, on one random batch reused (the update's compute, not the replay)."""
    from rlstash.train import algos, builders
    from rlstash.train.config import TrainConfig

    info = builders.probe_env(opts.env)
    cfg = TrainConfig(algo=opts.algo, env=opts.env, batch_size=opts.batch_size, device=opts.device)
    cfg, agent_cfg = algos.resolve(cfg, info.act_space)
    device = builders.resolve_device(cfg.device, "device")
    agent = builders.make_agent(cfg, agent_cfg, info, device)
    batch = _random_batch(info, opts.batch_size, device)

    def update() -> int:
        agent.update(batch)
        return 1

    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.torch_threads)
    try:
        rate, spread = timed_rate(update, opts.seconds)
    finally:
        torch.set_num_threads(threads)
    per_step = cfg.gradient_steps / cfg.train_freq
    arch = ",".join(map(str, agent_cfg.net_arch))
    return BenchRow(
        "agent updates", f"{cfg.algo}, batch {cfg.batch_size}, net {arch}, {device}", rate,
        "updates/s", spread, f"{cfg.gradient_steps}/{cfg.train_freq} per env step",
        {"updates_per_env_step": per_step},
    )  # fmt: skip


def _random_batch(info: Any, n: int, device: torch.device) -> dict[str, torch.Tensor]:
    from gymnasium import spaces

    obs_space, act_space = info.obs_space, info.act_space
    obs_space.seed(0)
    act_space.seed(0)
    obs = torch.as_tensor(np.stack([obs_space.sample() for _ in range(n)]))
    nxt = torch.as_tensor(np.stack([obs_space.sample() for _ in range(n)]))
    if isinstance(act_space, spaces.Discrete):
        action = torch.as_tensor(
            np.array([act_space.sample() for _ in range(n)]), dtype=torch.int64
        )
    else:
        action = torch.as_tensor(
            np.stack([act_space.sample() for _ in range(n)]), dtype=torch.float32
        )
    batch = {
        "obs": obs,
        "next_obs": nxt,
        "action": action,
        "reward": torch.randn(n),
        "terminated": torch.zeros(n, dtype=torch.bool),
    }
    return {k: v.to(device) for k, v in batch.items()}


def measure(opts: BenchOptions, progress: Callable[[str], None] | None = None) -> list[BenchRow]:
    """Every measurement of ``opts``: replay, env steps per worker count, agent updates."""
    say = progress or (lambda text: None)
    spec = opts.spec if opts.spec is not None else env_spec(opts.env)
    say("replay ...")
    rows = replay_rates(opts, spec)
    for w in opts.workers:
        say(f"env steps, workers={w} ...")
        rows.append(pool_rate(opts, w))
    say("agent updates ...")
    rows.append(update_rate(opts))
    return rows


def format_table(rows: list[BenchRow]) -> str:
    """The rows as an aligned table, then what bounds a run of the measured agent."""
    head = ("measurement", "setting", "rate", "unit", "spread", "note")
    body = [(r.what, r.setting, f"{r.rate:,.0f}", r.unit, f"{r.spread:.0%}", r.note) for r in rows]
    widths = [max(len(str(line[i])) for line in [head, *body]) for i in range(len(head))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in [head, *body]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines + [""] + summary(rows))


def summary(rows: list[BenchRow]) -> list[str]:
    """Which part bounds a run: env steps/s of the best pool vs the learner's env steps/s
    (updates/s divided by updates per env step), and the fastest worker count."""
    pools = [r for r in rows if r.what == "env steps"]
    learner = next((r for r in rows if r.what == "agent updates"), None)
    out = []
    if pools:
        best = max(pools, key=lambda r: r.rate)
        out.append(f"fastest collection: {best.setting} ({best.rate:,.0f} steps/s)")
    if learner is not None:
        per_step = learner.extra["updates_per_env_step"]
        bound = learner.rate / per_step
        out.append(
            f"the learner keeps up with {bound:,.0f} env steps/s at {per_step:g} updates per env step"
        )
        if pools:
            slower = "the learner" if bound < best.rate else "collection"
            out.append(
                f"bound by {slower}: expect about {min(bound, best.rate):,.0f} env steps/s "
                "(collection and updates alternate, so less: 1 / (1/a + 1/b) = "
                f"{1 / (1 / bound + 1 / best.rate):,.0f})"
            )
    return out
