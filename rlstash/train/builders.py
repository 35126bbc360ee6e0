"""Set-up of a training run, top to bottom (:func:`build_run`)::

    env_info = probe_env(cfg.env, cfg.history)      # spaces and reward threshold; refuses bad ids
    cfg, agent_cfg = algos.resolve(cfg, ...)        # defaults < env preset < what was given
    env = make_vec_env(cfg)                         # ProcessPoolVectorEnv (workers or in-process)
    rb = make_buffer(cfg, spec, run_dir, ...)       # stream replay: ram | disk | tiered
    agent = make_agent(cfg, agent_cfg, ...)         # the algorithm's learner for the action space
    limiter = make_limiter(cfg)                     # updates per inserted frame
    collector, eval_collector = ...                 # the loop (:mod:`.loop`) then runs them

Every refusal happens before the first step, as one ValueError line with the fix (an unknown
env id, an action space the algorithm cannot handle, a buffer that does not fit), and what was
built before a refusal is closed again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlstash.collect.sync import Collector
from rlstash.ratelimit import RateLimiter
from rlstash.replay import ReplayBuffer
from rlstash.spec import Field, Spec
from rlstash.train import algos, checkpoint, ray_run, run_memory, video
from rlstash.train.config import STORAGES, TrainConfig

DEFAULT_THRESHOLDS = {"Pendulum-v1": -200.0, "rlstash/Pendulum-v1": -200.0}


@dataclass
class EnvInfo:
    """What a run needs to know of its env before making any: spaces and reward threshold."""

    obs_space: Any
    act_space: Any
    threshold: float | None
    frame_stack: int = 1  # observations are windows of this many frames (history, Atari)


@dataclass
class Run:
    """The objects of one run, built (or restored) before the first step, and its counters."""

    cfg: TrainConfig  # resolved: every loop setting filled in, ``agent`` complete
    run_dir: Path
    threshold: float | None
    device: torch.device
    env: Any
    rb: ReplayBuffer
    agent: Any
    limiter: RateLimiter
    collector: Any  # a Collector, or with --ray a RayCollector (then also ``env``)
    eval_collector: Collector
    step: int = 0
    train_seconds: float = 0.0
    evals: list[dict[str, Any]] = field(default_factory=list)
    recorder: video.Recorder | None = None  # --video: records an episode per evaluation
    settings: dict[str, Any] = field(default_factory=dict)  # checked when a checkpoint loads

    @property
    def frames_per_collect(self) -> int:
        return self.collector.steps_per_batch * self.collector.num_envs

    def close(self) -> None:
        self.env.close()
        self.eval_collector.env.close()
        self.rb.close()

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds besides the buffer."""
        return {
            "step": self.step,
            "train_seconds": self.train_seconds,
            "config": dataclasses.asdict(self.cfg),
            "agent": self.agent.state_dict(),
            "limiter": self.limiter.state_dict(),
            "evals": self.evals,
            "settings": self.settings,
        }


def build_run(cfg: TrainConfig, run_dir: Path, state: dict[str, Any] | None = None) -> Run:
    """Everything a run needs, from its config (and a checkpoint's ``state`` when resuming).
    Settings are checked before ``run_dir`` is created; a run refused later removes it again.
    On-policy algorithms (PPO) get an :class:`rlstash.train.onpolicy.OnPolicyRun` instead
    (a rollout storage, no replay buffer or rate limiter)."""
    from rlstash.train import onpolicy

    if cfg.ray:
        ray_run.check(cfg)
    if cfg.algo in onpolicy.ALGOS:
        return onpolicy.build_onpolicy_run(cfg, run_dir, state)
    torch.set_num_threads(cfg.torch_threads)
    info = probe_env(cfg.env, cfg.history)
    cfg, agent_cfg = algos.resolve(cfg, info.act_space)
    device = resolve_device(cfg.device, "device")
    if is_batched(cfg.env):  # its batches stay on its device: the buffer lives there too
        cfg = dataclasses.replace(cfg, buffer_device=str(device))
    resolve_device(cfg.buffer_device, "buffer_device")
    if cfg.video:
        video.check_available()
    step = state["step"] if state else 0
    with contextlib.ExitStack() as undo:  # a refused run closes what it built
        if not run_dir.exists():
            top = run_dir  # the outermost directory this run creates
            while not top.parent.exists():
                top = top.parent
            undo.callback(shutil.rmtree, top, ignore_errors=True)
            run_dir.mkdir(parents=True)
        if state is None:  # buffer and agent first: each is refused before it allocates
            spec = step_spec(info.obs_space, info.act_space)
            rb = make_buffer(cfg, spec, run_dir, agent_cfg.gamma, device, info.frame_stack)
        else:
            rb = restore_buffer(run_dir, device)
        undo.callback(rb.close)
        agent = make_agent(cfg, agent_cfg, info, device)
        env = None
        if not cfg.ray:  # else the collector's Ray actors hold the envs
            env = make_vec_env(cfg.env, cfg.envs, cfg.workers, None, cfg.history, device)
            undo.callback(env.close)
        limiter = make_limiter(cfg)
        agent.planned_updates = planned_updates(cfg, limiter)  # compile="auto" reads it
        if cfg.ray:
            frames = collect_frames(cfg)
            collector = ray_run.make_collector(
                cfg, agent_cfg, info, limiter, frames, cfg.seed + step
            )
            env = collector  # closing the run closes it
            undo.callback(collector.close)
        else:
            collector = Collector(
                env, agent.act, collect_frames(cfg), device=agent.act_device, seed=cfg.seed + step
            )
        n_eval = min(cfg.eval_episodes, 10)
        recorder = video.Recorder(run_dir / "videos") if cfg.video else None
        eval_env = make_eval_env(cfg.env, n_eval, cfg.history, recorder)
        undo.callback(eval_env.close)
        eval_collector = Collector(eval_env, agent.act, n_eval, device=agent.act_device)
        threshold = cfg.threshold
        if threshold is None:
            threshold = DEFAULT_THRESHOLDS.get(cfg.env, info.threshold)
        run = Run(cfg, run_dir, threshold, device, env, rb, agent, limiter, collector, eval_collector)  # fmt: skip
        run.recorder, run.settings = recorder, checkpoint.settings(cfg, info)
        if state is not None:
            with checkpoint.reading(run_dir / checkpoint.NAME / checkpoint.STATE):
                agent.load_state_dict(state["agent"])
                limiter.load_state_dict(state["limiter"])
                run.train_seconds, run.evals = state["train_seconds"], state["evals"]
            run.step = step
        undo.pop_all()
    return run


def probe_env(env_id: str, history: int = 0) -> EnvInfo:
    """Spaces and reward threshold of one env, or a clear error. With ``history`` = k > 0 the
    observation space is that of windows of the last k observations
    (:func:`rlstash.envs.history.make_windowed`); plain 1-D Box observations only."""
    import gymnasium as gym

    from rlstash.envs.atari import FRAME_STACK, is_atari, make_atari
    from rlstash.envs.registry import make

    if history and is_atari(env_id):
        raise ValueError(
            f"history: {env_id} already sees stacks of {FRAME_STACK} frames (Atari preprocessing); "
            "drop --history"
        )
    try:  # ALE/..., dm_control/..., module:EnvId import their package; ALE: preprocessed
        env = make_atari(env_id, train=False) if is_atari(env_id) else make(env_id)
    except gym.error.Error as exc:
        raise ValueError(
            f"env: cannot make {env_id!r} ({exc}); see gymnasium.pprint_registry()"
        ) from None
    except ImportError as exc:
        raise ValueError(f"env: {env_id!r} needs a package that is missing: {exc}") from None
    try:
        threshold = env.spec.reward_threshold if env.spec is not None else None
        obs_space, act_space = env.observation_space, env.action_space
    finally:
        env.close()
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(
            f"env {env_id}: observation space {obs_space} is not a Box; the training loop needs array "
            "observations (wrap the env with gymnasium.wrappers.FlattenObservation; in the "
            "library, PPO takes the dict observations of batched torch envs: "
            "PPO(rlstash.obs_shapes(space), ...) with a RolloutStorage)"
        )
    if history:
        if len(obs_space.shape) != 1:
            raise ValueError(
                f"history: needs 1-D Box observations, env {env_id} has {obs_space}; "
                "drop --history or flatten the observations"
            )
        if not isinstance(act_space, gym.spaces.Discrete):
            raise ValueError(
                f"history: needs a Discrete action space (dqn or discrete sac), env {env_id} has "
                f"{act_space}; drop --history"
            )
        from gymnasium.vector.utils import batch_space

        obs_space = batch_space(obs_space, history)  # what FrameStackObservation declares
        return EnvInfo(obs_space, act_space, threshold, history)
    stack = FRAME_STACK if is_atari(env_id) else 1
    return EnvInfo(obs_space, act_space, threshold, stack)


def _factory(env_id: str, history: int, train: bool = True, **kwargs: Any) -> Any:
    """A picklable env factory (windowed envs with ``history``; ALE ids preprocessed for
    training or evaluation, :mod:`rlstash.envs.atari`; the modules are torch-free)."""
    from rlstash.envs.atari import is_atari, make_atari
    from rlstash.envs.history import make_windowed
    from rlstash.envs.registry import make

    if is_atari(env_id):
        return functools.partial(make_atari, env_id, train, **kwargs)
    if history:
        return functools.partial(make_windowed, env_id, history, **kwargs)
    return functools.partial(make, env_id, **kwargs)


def is_batched(env_id: str) -> bool:
    """Whether ``env_id`` is one of rlstash's batched torch envs (``rlstash/CartPole-v1``...)."""
    from rlstash.envs.batched import ENV_IDS

    return env_id in ENV_IDS


def make_vec_env(
    env_id: str,
    num_envs: int,
    workers: int | str,
    seed: int | None,
    history: int = 0,
    device: torch.device | None = None,
) -> Any:
    """A vectorized env: a batched torch env on ``device`` for rlstash's batched ids, else
    rlstash's ProcessPoolVectorEnv (``workers=0`` steps in-process)."""
    from rlstash.envs import ProcessPoolVectorEnv

    if is_batched(env_id):
        return make_batched_env(env_id, num_envs, workers, device, history)

    from rlstash.envs.atari import is_atari

    # a plain id: ProcessPoolVectorEnv makes it itself
    source = _factory(env_id, history) if history or is_atari(env_id) else env_id
    return ProcessPoolVectorEnv(source, num_envs=num_envs, num_workers=workers, seed=seed)


def make_batched_env(
    env_id: str,
    num_envs: int,
    workers: int | str,
    device: torch.device | None,
    history: int = 0,
    same_step: bool = False,
) -> Any:
    """One of rlstash's batched torch envs on ``device`` (next-step or same-step autoreset)."""
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    from rlstash.envs.batched import REFERENCE_IDS

    if history:
        raise ValueError(
            f"history: {env_id} is a batched torch env, which has no observation windows; "
            f"drop --history or use {REFERENCE_IDS[env_id]}"
        )
    if workers not in (0, "auto"):
        raise ValueError(
            f"workers: {env_id} steps all its envs in this process on --device, got "
            f"--workers {workers}; drop --workers (or use {REFERENCE_IDS[env_id]})"
        )
    mode = AutoresetMode.SAME_STEP if same_step else AutoresetMode.NEXT_STEP
    return gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="vector_entry_point",
        device=device or "cpu",
        autoreset_mode=mode,
    )


def make_eval_env(
    env_id: str, num_envs: int, history: int = 0, recorder: video.Recorder | None = None
) -> Any:
    """Evaluation envs stepped in-process (evaluation is short and must not disturb training).
    ALE ids play full games with unclipped scores; with a ``recorder`` env 0 renders and
    records the episodes it is asked to (:mod:`rlstash.train.video`)."""
    from gymnasium.vector import SyncVectorEnv

    factories = [_factory(env_id, history, train=False)] * num_envs
    if recorder is not None:
        factories[0] = recorder.wrap(
            _factory(env_id, history, train=False, render_mode="rgb_array")
        )
    return SyncVectorEnv(factories)


def make_agent(cfg: TrainConfig, agent_cfg: Any, info: EnvInfo, device: torch.device) -> Any:
    """The algorithm's learner for the env's action space (``cfg`` resolved); networks that
    do not fit are refused before they are built, naming the flags (:mod:`.run_memory`)."""
    learner = algos.ALGOS[cfg.algo].learner(info.act_space, cfg.env)
    build = functools.partial(
        learner.build, tuple(info.obs_space.shape), info.act_space, agent_cfg, device
    )
    run_memory.check_agent(build)
    return build()


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


def step_spec(obs_space: Any, act_space: Any) -> Spec:
    """What a collector step stores: obs and action (reward and flags are the stream's own)."""
    from gymnasium import spaces

    obs = Field(tuple(obs_space.shape), obs_space.dtype)
    if isinstance(act_space, spaces.Discrete):
        action = Field((), torch.int64)  # an index, never one-hot (seed 004)
    else:
        action = Field(tuple(act_space.shape), torch.float32)
    return Spec({"obs": obs, "action": action})


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
    plan = getattr(getattr(rb.storage, "backing", None), "plan", None)
    if plan is not None:
        lines.append(plan.format_table())
    nets = getattr(agent, "nets", {})
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
