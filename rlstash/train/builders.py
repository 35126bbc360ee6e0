"""Set-up of a training run, top to bottom (:func:`build_run`), like Acme's
``run_experiment``: env source -> store -> agent -> collector -> loop::

    learning = LEARNING[ALGOS[cfg.algo].store]  # REPLAY | ROLLOUT | OFFLINE | MULTIAGENT
    learning.check(cfg); ray_run.check(cfg)     # settings it has no use for; --ray's own
    cfg = learning.with_dataset(cfg)            # --dataset: the env it names (replay, offline)
    info = learning.probe(cfg)                  # EnvInfo (multi-agent: + agents, state)
    cfg, agent_cfg = algos.resolve(cfg, ...)    # defaults < env preset < what was given
    cfg, agent_cfg = learning.resolve(...)      # what the learning derives (rollout sizes...)
    cfg, why = learning.pick_backend(cfg); device = resolve_device(cfg.device)
    cfg = learning.place(cfg, device)           # e.g. the buffer beside a batched env
    store = learning.make_store(...)            # stream replay | RolloutStorage | dataset
                                                #   | MultiAgentRollout: each planned first
    agent = learning.make_agent(...)            # the algorithm's learner for the spaces
    env = learning.make_env(...)                # make_vec_env | make_multiagent_env
    limiter = learning.make_limiter(cfg)        # updates per inserted frame (replay only)
    collector, publish = learning.make_collector(...)  # Collector | RayCollector | multi-agent
    eval_collector = learning.make_eval(...)    # deterministic evaluation on its own envs
    run.settings, run.env_note = learning.settings(...), learning.env_note(...)
    # the loop (:func:`rlstash.train.loop.run_loop`) then runs them

Env construction is :mod:`rlstash.envs.make` (``probe_env``, ``make_vec_env``... are
re-exported here). Every refusal happens before the first step, as one ValueError line with
the fix (an unknown env id, an action space the algorithm cannot handle, a buffer that does
not fit), and what was built before a refusal is closed again.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlstash.envs import make as envs_make
from rlstash.envs import pool_async
from rlstash.envs.make import EnvInfo, is_batched, make_eval_env, make_vec_env, probe_env
from rlstash.ratelimit import RateLimiter
from rlstash.replay import ReplayBuffer
from rlstash.spec import Spec
from rlstash.storage.stream import StreamStorage
from rlstash.train import algos, checkpoint, marl, offline, onpolicy, ray_run, run_memory, video
from rlstash.train.config import STORAGES, TrainConfig
from rlstash.train.marl_offpolicy import MARL_REPLAY
from rlstash.train.run import Learning, Run, make_agent, make_collector, make_run_dir, step_spec

__all__ = [
    "DEFAULT_THRESHOLDS", "LEARNING", "REPLAY", "EnvInfo", "Run", "build_run", "collect_frames",
    "describe_memory", "is_batched", "make_agent", "make_batched_env", "make_buffer", "make_collector",
    "make_eval_env", "make_limiter", "make_vec_env", "planned_updates", "probe_env",
    "resolve_device", "restore_buffer", "step_spec",
]  # fmt: skip
DEFAULT_THRESHOLDS = envs_make.DEFAULT_THRESHOLDS
make_batched_env = envs_make.make_batched_env
_factory = envs_make.factory  # the former private name


def build_run(cfg: TrainConfig, run_dir: Path, state: dict[str, Any] | None = None) -> Run:
    """Everything a run needs, from its config (and a checkpoint's ``state`` when resuming).
    Settings are checked before ``run_dir`` is created; a run refused later removes it again.
    What differs between the algorithms is the :class:`Learning` of the store their registry
    entry names (:attr:`rlstash.train.algos.Algo.store`): one path for all four stores."""
    learning = LEARNING[algos.ALGOS[cfg.algo].store]
    torch.set_num_threads(cfg.torch_threads)
    learning.check(cfg)
    learning.check_env_kwargs(cfg)
    check_env_batch(cfg, learning)
    if cfg.ray:
        ray_run.check(cfg)
    cfg = learning.with_dataset(cfg)  # --dataset: the env it names (refused where unused)
    info = learning.probe(cfg)  # spaces and threshold; refuses bad ids
    given = dict(cfg.agent)
    cfg, agent_cfg = algos.resolve(cfg, info.act_space)
    cfg, agent_cfg = learning.resolve(cfg, agent_cfg, given)
    cfg, why = learning.pick_backend(cfg)  # the resolved config records the env backend
    device = resolve_device(cfg.device, "device")  # after every settings check: no CUDA call
    cfg = learning.place(cfg, device)
    if cfg.video:
        video.check_available()
    step = state["step"] if state else 0
    with contextlib.ExitStack() as undo:  # a refused run closes what it built
        make_run_dir(run_dir, undo)
        # store and agent first: each is refused before it allocates (invariant I2)
        store = learning.make_store(cfg, agent_cfg, info, run_dir, device, state)
        undo.callback(learning.close_store, store)
        agent = learning.make_agent(cfg, agent_cfg, info, device)
        env = None
        if not cfg.ray:  # else the collector's Ray actors hold the envs
            env = learning.make_env(cfg, agent_cfg, info, device, cfg.seed + step)
            undo.callback(env.close)
        limiter = learning.make_limiter(cfg)
        frames = learning.collect_frames(cfg, agent_cfg)
        agent.planned_updates = learning.planned_updates(cfg, agent_cfg, limiter, frames)
        collector, publish = learning.make_collector(
            cfg, agent_cfg, info, env, agent, limiter, frames, cfg.seed + step
        )
        if env is None:  # Ray: the collector's actors hold the envs; closing the run closes it
            env = collector
            undo.callback(collector.close)
        recorder = video.Recorder(run_dir / "videos") if cfg.video else None
        eval_collector = learning.make_eval(cfg, agent_cfg, info, agent, recorder)
        undo.callback(eval_collector.env.close)
        threshold = envs_make.threshold_of(cfg.env, info, cfg.threshold)
        run = Run(cfg, run_dir, threshold, device, env, store, agent, collector, eval_collector,
                  learning, limiter, recorder=recorder, publish=publish)  # fmt: skip
        run.settings = learning.settings(cfg, info)
        run.env_note = learning.env_note(cfg, why, env)
        if state is not None:
            with checkpoint.reading(run_dir / checkpoint.NAME / checkpoint.STATE):
                agent.load_state_dict(state["agent"])
                if limiter is not None:
                    limiter.load_state_dict(state["limiter"])
                run.train_seconds, run.evals = state["train_seconds"], state["evals"]
            run.step = step
        undo.pop_all()
    return run


class ReplayLearning(Learning):
    """Off-policy learning: collect ``train_freq`` env steps into a replay buffer, then as
    many updates on sampled batches as the rate limiter allows (``gradient_steps`` per
    ``train_freq`` env steps once ``learning_starts`` were stored)."""

    name = "replay"

    def place(self, cfg: TrainConfig, device: torch.device) -> TrainConfig:
        if is_batched(cfg.env):  # its batches stay on its device: the buffer lives there too
            cfg = dataclasses.replace(cfg, buffer_device=str(device))
        resolve_device(cfg.buffer_device, "buffer_device")
        return cfg

    def with_dataset(self, cfg: TrainConfig) -> TrainConfig:
        return offline.with_dataset_env(cfg)  # offline-to-online: make_store seeds the replay

    def make_env(
        self, cfg: TrainConfig, agent_cfg: Any, info: EnvInfo, device: torch.device, seed: int
    ) -> Any:
        if cfg.env_batch:  # asynchronous batches: the pool seeds its envs (env i: seed + i)
            check_env_blocks(cfg)
            return make_vec_env(
                cfg.env, cfg.envs, cfg.workers, seed, cfg.history, device,
                backend=cfg.env_backend, batch_size=cfg.env_batch,
            )  # fmt: skip
        return make_vec_env(
            cfg.env, cfg.envs, cfg.workers, None, cfg.history, device, backend=cfg.env_backend
        )

    def make_collector(
        self, cfg: TrainConfig, agent_cfg: Any, info: EnvInfo, env: Any, agent: Any,
        limiter: Any, frames: int, seed: int,
    ) -> tuple[Any, Callable[[Run], None] | None]:  # fmt: skip
        if not cfg.env_batch:
            return super().make_collector(cfg, agent_cfg, info, env, agent, limiter, frames, seed)
        from rlstash.collect.async_batches import AsyncBatchCollector

        device = agent.act_device

        @torch.no_grad()
        def policy(obs: Any, env_ids: Any) -> Any:  # the ready envs' observations
            return agent.act(torch.from_numpy(obs).to(device)).to("cpu").numpy()

        return AsyncBatchCollector(env, policy, frames_per_batch=frames), None

    def make_store(
        self, cfg: TrainConfig, agent_cfg: Any, info: EnvInfo, run_dir: Path,
        device: torch.device, state: dict[str, Any] | None,
    ) -> ReplayBuffer:  # fmt: skip
        if state is not None:
            return restore_buffer(run_dir, device)
        spec = step_spec(info.obs_space, info.act_space)
        if cfg.dataset:  # offline-to-online: the dataset's lanes planned beside the online ones
            more = offline.dataset_slots(cfg, info)
            size = cfg.buffer_size // cfg.lanes * cfg.lanes + more
            cfg = dataclasses.replace(cfg, buffer_size=size)
        rb = make_buffer(cfg, spec, run_dir, agent_cfg.gamma, device, info.frame_stack)
        if cfg.dataset:  # the dataset's episodes first, in every lane
            with contextlib.ExitStack() as undo:
                undo.callback(rb.close)
                offline.seed_buffer(rb, cfg)
                undo.pop_all()
        return rb

    def make_limiter(self, cfg: TrainConfig) -> RateLimiter:
        return make_limiter(cfg)

    def collect_frames(self, cfg: TrainConfig, agent_cfg: Any) -> int:
        return collect_frames(cfg)

    def planned_updates(
        self, cfg: TrainConfig, agent_cfg: Any, limiter: RateLimiter, frames: int
    ) -> int:
        return planned_updates(cfg, limiter)  # compile="auto" reads it

    def make_eval_env(
        self, cfg: TrainConfig, agent_cfg: Any, info: EnvInfo, num_envs: int, recorder: Any
    ) -> Any:
        return make_eval_env(cfg.env, num_envs, cfg.history, recorder)

    def describe(self, run: Run) -> str:
        return describe_memory(run.rb, run.agent)

    def resumed(self, run: Run) -> str:
        return f"resumed at step {run.step} with {len(run.rb)} stored slots"

    def iterate(self, run: Run) -> Callable[[dict[str, Any]], dict[str, Any]]:
        cfg, agent, rb, limiter = run.cfg, run.agent, run.rb, run.limiter

        def iterate(metrics: dict[str, Any]) -> dict[str, Any]:
            batch = run.collector.collect()
            rb.extend(batch)
            limiter.on_insert(run.frames_per_collect)
            run.step += run.frames_per_collect
            updates = agent.updates
            while limiter.can_sample():
                metrics = agent.update(rb.sample(cfg.batch_size))
                limiter.on_sample()
            if run.publish is not None and agent.updates != updates:
                run.publish(run)  # --ray: the new policy to the actors (one ray.put)
            return metrics

        return iterate

    def save(self, run: Run) -> Path:
        return checkpoint.save(run.run_dir, run.state(), run.rb)

    def close_store(self, store: ReplayBuffer) -> None:
        store.close()


REPLAY = ReplayLearning()
LEARNING: dict[str, Learning] = {
    "replay": REPLAY,
    "rollout": onpolicy.ROLLOUT,
    "offline": offline.OFFLINE,
    "multiagent": marl.MULTIAGENT,
    "marl_replay": MARL_REPLAY,
}
"""Store name (:attr:`rlstash.train.algos.Algo.store`) -> the :class:`Learning` of its runs."""


def check_env_batch(cfg: TrainConfig, learning: Learning) -> None:
    """``--env-batch`` only where asynchronous batches fit: a replay (each env's steps into
    its lane) fed by a gymnasium pool or EnvPool in this process, next-step autoreset."""
    if not cfg.env_batch:
        return
    blockers = [
        (learning is not REPLAY, f"--algo {cfg.algo} learns from whole [T, N] rollouts"),
        (bool(cfg.ray), "--ray actors step synchronous pools"),
        (is_batched(cfg.env), f"{cfg.env} is a batched torch env stepped all at once"),
        (bool(cfg.history), "--history windows are built by the synchronous collector"),
        (bool(cfg.dataset), "--dataset seeds the replay through the synchronous collector"),
        (cfg.workers == "auto", "--workers auto times synchronous layouts"),
    ]
    blocker = next((why for hit, why in blockers if hit), None)
    if blocker:
        raise ValueError(
            f"env_batch: asynchronous batches cannot run here: {blocker}; drop --env-batch"
        )


def check_env_blocks(cfg: TrainConfig) -> None:
    """``--env-batch`` over rlstash's pool: ``--workers`` must split ``--envs`` into equal
    blocks of which the batch is a multiple (a worker steps its envs together)."""
    workers = cfg.workers
    if cfg.env_backend == "envpool" or not isinstance(workers, int) or workers <= 0:
        return
    if not pool_async.fits_blocks(cfg.envs, workers, cfg.env_batch):
        fits = pool_async.default_workers(cfg.envs, cfg.env_batch, workers)
        raise ValueError(
            f"env_batch: expected a multiple of the envs per worker, got {cfg.env_batch} with "
            f"--envs {cfg.envs} over --workers {workers} (a worker steps its envs together); "
            f"give --workers {fits} or 0 (the default layout for the batches)"
        )


def make_limiter(cfg: TrainConfig) -> RateLimiter:
    """``gradient_steps`` updates of ``batch_size`` rows per ``train_freq`` env steps, once
    ``learning_starts`` (and at least a batch) were collected, and every env took
    ``n_steps + 1`` steps (before that no n-step transition is complete: with many envs
    ``learning_starts`` frames can be fewer)."""
    return RateLimiter(
        min_size=max(cfg.learning_starts, cfg.batch_size, cfg.lanes * (cfg.n_steps + 1)),
        samples_per_insert=cfg.gradient_steps * cfg.batch_size / cfg.train_freq,
        batch_size=cfg.batch_size,
        insert_chunk=collect_frames(cfg),
    )


def planned_updates(cfg: TrainConfig, limiter: RateLimiter) -> int:
    """The updates a run of ``cfg.steps`` env steps takes in all: ``gradient_steps`` per
    ``train_freq`` env steps once ``limiter.min_size`` were stored."""
    return max(0, cfg.steps - limiter.min_size) * cfg.gradient_steps // cfg.train_freq


def collect_frames(cfg: TrainConfig) -> int:
    """Env steps per collection: ``train_freq`` rounded down to a multiple of the envs (>= 1
    step of every env; >= 2 on Ray, whose chunks may start with a bridge row)."""
    return max(2 if cfg.ray else 1, cfg.train_freq // cfg.lanes) * cfg.lanes


def make_buffer(
    cfg: TrainConfig,
    spec: Spec,
    run_dir: Path,
    gamma: float,
    learner_device: torch.device,
    frame_stack: int | None = None,
) -> ReplayBuffer:
    """A stream-layout replay buffer (each byte once) on RAM, disk, or GPU-hot/disk-cold tiers,
    reading ``cfg.n_steps``-step returns with the agent's ``gamma``. With ``frame_stack`` = k > 1
    (default: ``cfg.history``; Atari: 4) observations arrive as windows [k, ...] and only the
    newest frame of each is stored; reads rebuild the windows."""
    from rlstash.memory import InsufficientMemoryError
    from rlstash.storage import MemmapStorage, ReadSpec, StreamStorage, TensorStorage, TieredStorage

    if cfg.storage not in STORAGES:
        raise ValueError(f"storage: expected one of {STORAGES}, got {cfg.storage!r}")
    num_envs, buffer_device = cfg.lanes, resolve_device(cfg.buffer_device, "buffer_device")
    capacity = max(num_envs, cfg.buffer_size // num_envs * num_envs)
    k = (cfg.history or 1) if frame_stack is None else frame_stack
    reads = ReadSpec(n_step=cfg.n_steps, gamma=gamma, frame_stack=k)
    if cfg.storage == "ram":
        backing: Any = cfg.compression() or "ram"  # --compress: frames compressed in RAM
    elif cfg.storage == "disk":
        backing = "disk"
    n_hot = max(1024, capacity // 10)
    if cfg.storage == "tiered":

        def backing(s: Spec, cap: int) -> TieredStorage:
            hot = TensorStorage(s, min(n_hot, cap), device=buffer_device)
            return TieredStorage(hot, MemmapStorage(s, cap, run_dir / "buffer"))

    path = run_dir / "buffer" if cfg.storage != "ram" else None  # disk, tiered: resumable there
    device = buffer_device if cfg.storage == "ram" else "cpu"
    try:  # every part planned and checked before it is allocated: one line naming the flags
        if cfg.storage == "tiered":
            run_memory.check_tiered(spec, k, num_envs, capacity, n_hot, buffer_device, path)
        st = StreamStorage(
            spec, num_envs, capacity, backing=backing, device=device, path=path, reads=reads,
            stacked_input=k > 1,
        )  # fmt: skip
    except InsufficientMemoryError as exc:
        raise run_memory.buffer_refusal(exc, cfg, capacity) from None
    return ReplayBuffer(st, seed=cfg.seed, device=learner_device)


def restore_buffer(run_dir: Path, learner_device: torch.device) -> ReplayBuffer:
    """The replay buffer of a run's checkpoint (checked against its manifest)."""
    path = run_dir / checkpoint.NAME / checkpoint.BUFFER
    with checkpoint.reading(path):
        return ReplayBuffer.load(path, device=learner_device)


def describe_memory(rb: ReplayBuffer, agent: Any) -> str:
    """The memory plan printed at start: buffer bytes per place and network bytes."""
    from rlstash.agents.nets import param_bytes
    from rlstash.memory import human_bytes

    lines = [
        f"replay buffer: {type(rb.storage).__name__}, {rb.capacity} slots, {human_bytes(rb.storage.nbytes)} on {rb.storage.device}"
    ]
    plan = rb.storage.plan if isinstance(rb.storage, StreamStorage) else None
    if plan is not None:  # the stream's: its backing's fields and its lanes' bookkeeping
        lines.append(plan.format_table())
    nets = agent.nets
    lines.append(
        f"networks: {human_bytes(param_bytes(*nets.values()))} of parameters on {agent.device} (x~4 with Adam state and gradients)"
    )
    return "\n".join(lines)


def resolve_device(device: str, name: str) -> torch.device:
    """A device setting as a torch.device (``auto``: CUDA when available), or a ValueError."""
    from rlstash.device import resolve_device as parse

    dev = parse(device, name)
    assert dev is not None
    return dev
