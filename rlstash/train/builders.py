"""Builders for a training run: envs, agent and replay buffer from a few plain settings.

Every refusal happens here, before training starts, as one ValueError line with the fix:
an unknown env id, an action space the algorithm cannot handle, a buffer that does not fit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rlstash.replay import ReplayBuffer
from rlstash.spec import Field, Spec

ALGOS = ("dqn", "sac")
STORAGES = ("ram", "disk", "tiered")


def env_spaces(env_id: str, history: int = 0) -> tuple[Any, Any, float | None]:
    """(observation space, action space, reward threshold) of one env, or a clear error.
    With ``history`` = k > 0 the observation space is that of windows of the last k
    observations (:func:`rlstash.envs.history.make_windowed`); plain 1-D Box observations only."""
    import gymnasium as gym

    try:
        env = gym.make(env_id)
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
    if history:
        if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
            raise ValueError(
                f"history: needs 1-D Box observations, env {env_id} has {obs_space}; "
                "drop --history or flatten the observations"
            )
        from gymnasium.vector.utils import batch_space

        obs_space = batch_space(obs_space, history)  # what FrameStackObservation declares
    return obs_space, act_space, threshold


def _factory(env_id: str, history: int) -> Any:
    """A picklable env factory (windowed envs with ``history``; the module is torch-free)."""
    import functools

    import gymnasium as gym

    from rlstash.envs.history import make_windowed

    return (
        functools.partial(make_windowed, env_id, history)
        if history
        else functools.partial(gym.make, env_id)
    )


def make_vec_env(
    env_id: str, num_envs: int, workers: int | str, seed: int | None, history: int = 0
) -> Any:
    """A vectorized env: rlstash's ProcessPoolVectorEnv (``workers=0`` steps in-process)."""
    from rlstash.envs import ProcessPoolVectorEnv

    source = (
        _factory(env_id, history) if history else env_id
    )  # an id: ProcessPoolVectorEnv makes it itself
    return ProcessPoolVectorEnv(source, num_envs=num_envs, num_workers=workers, seed=seed)


def make_eval_env(env_id: str, num_envs: int, history: int = 0) -> Any:
    """Evaluation envs stepped in-process (evaluation is short and must not disturb training)."""
    from gymnasium.vector import SyncVectorEnv

    return SyncVectorEnv([_factory(env_id, history)] * num_envs)


def make_agent(
    algo: str,
    env_id: str,
    obs_space: Any,
    act_space: Any,
    device: torch.device,
    overrides: dict[str, Any],
    history: int = 0,
) -> Any:
    """DQN or SAC (continuous or discrete, by the action space) with the env's preset.
    With ``history`` > 0 the agent reads observation windows through an LSTM
    (``history_hidden``, default 64)."""
    from gymnasium import spaces

    if history:
        if algo == "sac" and not isinstance(act_space, spaces.Discrete):
            raise ValueError(
                f"history: needs a Discrete action space (dqn or discrete sac), env {env_id} has "
                f"{act_space}; drop --history"
            )
        overrides = {"history_hidden": 64, **overrides}

    if algo not in ALGOS:
        raise ValueError(f"algo: expected one of {ALGOS}, got {algo!r}")
    if not isinstance(obs_space, spaces.Box):
        raise ValueError(
            f"env {env_id}: observation space {obs_space} is not a Box; the training loop needs array "
            "observations (wrap the env with gymnasium.wrappers.FlattenObservation)"
        )
    obs_shape = tuple(obs_space.shape)
    if algo == "dqn":
        if not isinstance(act_space, spaces.Discrete):
            raise ValueError(
                f"algo dqn: needs a Discrete action space, env {env_id} has {act_space}; use --algo sac"
            )
        from rlstash.agents.dqn import DQN, DQNConfig

        return DQN(
            obs_shape, int(act_space.n), DQNConfig.for_env(env_id, **overrides), device=device
        )
    if isinstance(act_space, spaces.Discrete):
        from rlstash.agents.sac_discrete import DiscreteSAC, DiscreteSACConfig

        return DiscreteSAC(
            obs_shape,
            int(act_space.n),
            DiscreteSACConfig.for_env(env_id, **overrides),
            device=device,
        )
    if isinstance(act_space, spaces.Box) and len(act_space.shape) == 1:
        from rlstash.agents.sac import SAC, SACConfig

        cfg = SACConfig.for_env(env_id, **overrides)
        return SAC(
            obs_shape, int(act_space.shape[0]), act_space.low, act_space.high, cfg, device=device
        )
    raise ValueError(
        f"algo sac: needs a Discrete or a 1-D Box action space, env {env_id} has {act_space}"
    )


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
    spec: Spec,
    num_envs: int,
    capacity: int,
    storage: str,
    run_dir: Path,
    buffer_device: torch.device,
    n_step: int,
    gamma: float,
    seed: int,
    learner_device: torch.device,
    history: int = 0,
) -> ReplayBuffer:
    """A stream-layout replay buffer (each byte once) on RAM, disk, or GPU-hot/disk-cold tiers.
    With ``history`` = k > 0 observations arrive as windows [k, ...] and only the newest of each
    is stored; reads rebuild the windows."""
    from rlstash.storage import MemmapStorage, ReadSpec, StreamStorage, TensorStorage, TieredStorage

    if storage not in STORAGES:
        raise ValueError(f"storage: expected one of {STORAGES}, got {storage!r}")
    capacity = max(num_envs, capacity // num_envs * num_envs)
    reads = ReadSpec(n_step=n_step, gamma=gamma, frame_stack=history or 1)
    if storage == "ram":
        backing: Any = "ram"
    elif storage == "disk":
        backing = "disk"
    else:
        n_hot = max(1024, capacity // 10)

        def backing(s: Spec, cap: int) -> TieredStorage:
            hot = TensorStorage(s, min(n_hot, cap), device=buffer_device)
            return TieredStorage(hot, MemmapStorage(s, cap, run_dir / "buffer"))

    path = run_dir / "buffer" if storage == "disk" else None
    device = buffer_device if storage == "ram" else "cpu"
    st = StreamStorage(
        spec, num_envs, capacity, backing=backing, device=device, path=path, reads=reads,
        stacked_input=bool(history),
    )  # fmt: skip
    return ReplayBuffer(st, seed=seed, device=learner_device)


def describe_memory(rb: ReplayBuffer, agent: Any) -> str:
    """The memory plan printed at start: buffer bytes per place and network bytes."""
    from rlstash.agents.nets import param_bytes
    from rlstash.diag.memory import human_bytes

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


def resolve_learner_device(device: str) -> torch.device:
    from rlstash.device import resolve_device

    dev = resolve_device(device, "device")
    assert dev is not None
    return dev
