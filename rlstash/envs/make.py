"""Env construction for a training run: probe an id, make its factories, its vectorized
training env and its evaluation envs.

::

    info = probe_env("CartPole-v1")                    # spaces and reward threshold, or a ValueError
    env = make_vec_env("CartPole-v1", 8, "auto", 0)    # ProcessPoolVectorEnv (or a batched torch env)
    eval_env = make_eval_env("CartPole-v1", 10)        # in-process, full games for ALE ids

Torch-free at import like the rest of :mod:`rlstash.envs` (a batched torch env loads torch
when made); the factories are picklable, so workers and Ray actors make the same envs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

DEFAULT_THRESHOLDS = {"Pendulum-v1": -200.0, "rlstash/Pendulum-v1": -200.0}
"""Reward thresholds of ids whose gymnasium spec has none (the run stops there)."""


@dataclass
class EnvInfo:
    """What a run needs to know of its env before making any: spaces and reward threshold."""

    obs_space: Any
    act_space: Any
    threshold: float | None
    frame_stack: int = 1  # observations are windows of this many frames (history, Atari)


def probe_env(env_id: str, history: int = 0) -> EnvInfo:
    """Spaces and reward threshold of one env, or a clear error. With ``history`` = k > 0 the
    observation space is that of windows of the last k observations
    (:func:`rlstash.envs.history.make_windowed`); plain 1-D Box observations only."""
    import gymnasium as gym

    from rlstash.envs.atari import FRAME_STACK, is_atari, make_atari
    from rlstash.envs.registry import make

    if env_id.startswith("vmas/"):  # multi-agent: one agent's spaces (rlstash.train.marl)
        from rlstash.envs.vmas import probe_spaces

        return EnvInfo(*probe_spaces(env_id), None)
    if history and is_atari(env_id):
        raise ValueError(
            f"history: {env_id} already sees stacks of {FRAME_STACK} frames (Atari preprocessing); "
            "drop --history"
        )
    if env_id.startswith("pettingzoo:"):
        raise ValueError(
            f"env: {env_id!r} is a multi-agent PettingZoo env; single-agent algorithms cannot "
            "train it: make it with rlstash.envs.make.make_multiagent_env (a "
            "MultiAgentVectorEnv) and a multi-agent algorithm"
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


def threshold_of(env_id: str, info: EnvInfo, given: float | None) -> float | None:
    """The run's reward threshold: ``given``, else :data:`DEFAULT_THRESHOLDS`, else the
    env's spec's."""
    if given is not None:
        return given
    return DEFAULT_THRESHOLDS.get(env_id, info.threshold)


def factory(env_id: str, history: int, train: bool = True, **kwargs: Any) -> Any:
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


def vec_source(env_id: str, history: int = 0) -> Any:
    """What a vectorized env of ``env_id`` is made from: the id itself (the pool makes it) or,
    with windows (``history``) or Atari preprocessing, a :func:`factory`."""
    from rlstash.envs.atari import is_atari

    return factory(env_id, history) if history or is_atari(env_id) else env_id


def env_source(env_id: str, act_space: Any, clip: bool, train: bool = True, **kwargs: Any) -> Any:
    """A factory of an on-policy run's env: ALE ids preprocessed for training or evaluation
    (:mod:`rlstash.envs.atari`), ClipAction added for a Gaussian policy that leaves clipping
    to the env (``clip``: PPO's bound 'clip'); else the id itself (the pool makes it) unless
    ``kwargs`` are given."""
    from gymnasium import spaces

    from rlstash.envs.atari import is_atari, make_atari
    from rlstash.envs.history import make_clipped
    from rlstash.envs.registry import make

    if is_atari(env_id):
        return functools.partial(make_atari, env_id, train, **kwargs)
    if isinstance(act_space, spaces.Box) and clip:
        return functools.partial(make_clipped, env_id, **kwargs)
    return functools.partial(make, env_id, **kwargs) if kwargs else env_id


def is_batched(env_id: str) -> bool:
    """Whether ``env_id`` is one of rlstash's batched torch envs (``rlstash/CartPole-v1``...)."""
    from rlstash.envs.batched import ENV_IDS

    return env_id in ENV_IDS


ENV_BACKENDS = ("auto", "gymnasium", "envpool")


def resolve_backend(
    backend: str, env_id: str, history: int = 0, same_step: bool = False, ray: bool = False
) -> tuple[str, str]:
    """``(the env backend that runs, why)`` for ``backend`` (``auto``: EnvPool where it is
    installed and has ``env_id`` and the run needs nothing only gymnasium's path gives, else
    gymnasium; ``envpool``: EnvPool or a ValueError naming what stands in the way)."""
    from rlstash.envs import envpool_env

    if backend not in ENV_BACKENDS:
        raise ValueError(f"env_backend: expected one of {ENV_BACKENDS}, got {backend!r}")
    if backend == "gymnasium":
        return "gymnasium", "asked for"
    blockers = [
        (is_batched(env_id), "it is one of rlstash's batched torch envs"),
        (bool(history), "--history windows are gymnasium wrappers"),
        (same_step, "the algorithm needs same-step autoreset (EnvPool resets at the next step)"),
        (ray, "--ray actors step gymnasium pools"),
    ]
    blocker = next((why for hit, why in blockers if hit), None)
    if backend == "envpool":
        if blocker:
            raise ValueError(
                f"env_backend: envpool cannot run {env_id} here: {blocker}; use --env-backend "
                "gymnasium (or auto)"
            )
        try:
            envpool_env.import_envpool()
        except ModuleNotFoundError as exc:
            raise ValueError(f"env_backend: {exc}") from None
        if not envpool_env.supported(env_id):
            raise ValueError(
                f"env_backend: EnvPool has no env {env_id!r} (as {envpool_env.task_id(env_id)!r}); "
                "see envpool.list_all_envs(), or use --env-backend gymnasium"
            )
        return "envpool", "asked for"
    if blocker:
        return "gymnasium", blocker
    if not envpool_env.installed():
        return "gymnasium", f"envpool is not installed ({envpool_env.INSTALL_HINT})"
    if not envpool_env.supported(env_id):
        return "gymnasium", f"EnvPool has no {env_id}"
    return "envpool", f"EnvPool has {env_id}"


def describe_env(env_id: str, backend: str, why: str, env: Any = None) -> str:
    """The start-up line of a run's env: its id, the backend that runs it and why, and how
    (``env``: the vectorized env, a ProcessPoolVectorEnv's layout or EnvPool's version)."""
    from rlstash.envs.process_pool import ProcessPoolVectorEnv

    how = ""
    if backend == "envpool":
        from rlstash.envs.envpool_env import import_envpool

        how = f", EnvPool {import_envpool().__version__} C++ envs"
    elif isinstance(env, ProcessPoolVectorEnv):  # its layout
        how = f", {env!r}"
    batch = getattr(env, "batch_size", None)
    if isinstance(batch, int) and batch < getattr(env, "num_envs", batch):
        how += f", asynchronous batches of {batch} ready envs"
    return f"env: {env_id} from {backend} ({why}{how})"


def make_vec_env(
    env_id: str,
    num_envs: int,
    workers: int | str,
    seed: int | None,
    history: int = 0,
    device: Any = None,
    same_step: bool = False,
    source: Any = None,
    backend: str = "gymnasium",
    batch_size: int | None = None,
) -> Any:
    """A vectorized env: a batched torch env on ``device`` (a torch.device) for rlstash's
    batched ids, else rlstash's ProcessPoolVectorEnv (``workers=0`` steps in-process) of
    ``source`` (default: :func:`vec_source`). ``same_step``: same-step autoreset (every row a
    real step; final observations come with the batch). ``backend="envpool"``: an
    :class:`~rlstash.envs.envpool_env.EnvPoolVectorEnv` (training preprocessing for ALE ids;
    ``workers`` > 0: its threads), see :func:`resolve_backend`. ``batch_size``: asynchronous
    batches of that many ready envs (``workers=0`` then: the pool's default layout for them).
    """
    from rlstash.envs.process_pool import ProcessPoolVectorEnv

    if backend == "envpool":
        from rlstash.envs.envpool_env import EnvPoolVectorEnv

        threads = workers if isinstance(workers, int) and workers > 0 else None
        mode = "SameStep" if same_step else "NextStep"
        return EnvPoolVectorEnv(
            env_id, num_envs, seed, train=True, num_threads=threads, autoreset_mode=mode,
            batch_size=batch_size,
        )  # fmt: skip
    if is_batched(env_id):
        return make_batched_env(env_id, num_envs, workers, device, history, same_step)
    if source is None:
        source = vec_source(env_id, history)
    mode = "SameStep" if same_step else "NextStep"
    if batch_size is not None:
        workers = None if workers == 0 else workers  # type: ignore[assignment]
    return ProcessPoolVectorEnv(
        source, num_envs=num_envs, num_workers=workers, seed=seed, autoreset_mode=mode,
        batch_size=batch_size,
    )  # fmt: skip


def is_multiagent(env_id: Any) -> bool:
    """Whether ``env_id`` names a multi-agent env source (``pettingzoo:<module>`` or
    ``vmas/<scenario>``)."""
    return isinstance(env_id, str) and env_id.startswith(("pettingzoo:", "vmas/"))


def parse_env_kwargs(text: str | None) -> dict[str, Any]:
    """``--env-kwargs``: a JSON object (``'{"N": 3, "max_cycles": 50}'``); None or "" -> {}.

    Raises:
        ValueError: naming the flag, what came and the expected form.
    """
    import json

    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"--env-kwargs: expected a JSON object such as '{{\"N\": 3}}', got {text!r} ({exc})"
        ) from None
    if not isinstance(value, dict):
        raise ValueError(
            f"--env-kwargs: expected a JSON object such as '{{\"N\": 3}}', got {text!r} "
            f"(a {type(value).__name__})"
        )
    return value


def make_multiagent_env(
    env_id: str,
    num_envs: int,
    workers: int | str | None,
    seed: int | None,
    env_kwargs: dict[str, Any] | None = None,
    device: Any = "cpu",
    **options: Any,
) -> Any:
    """A ``MultiAgentVectorEnv`` (:mod:`rlstash.envs.multiagent`) of a multi-agent id:
    ``pettingzoo:<module>`` (e.g. ``pettingzoo:mpe2.simple_spread_v3``): that module's
    ``parallel_env(**env_kwargs)`` in the process pool (:mod:`rlstash.envs.pettingzoo`;
    ``workers`` 0: in-process; ``options``: more ``PettingZooVectorEnv`` arguments; its
    tensors are on the CPU); ``vmas/<scenario>``: VMAS's torch-batched scenario on ``device``
    (:mod:`rlstash.envs.vmas`; ``env_kwargs``: the scenario's settings).

    Raises:
        ValueError: for other ids, naming the id and the accepted forms.
    """
    if not is_multiagent(env_id):
        raise ValueError(
            f"env: {env_id!r} is not a multi-agent env id; expected 'pettingzoo:<module>' "
            "(e.g. pettingzoo:mpe2.simple_spread_v3) or 'vmas/<scenario>' (e.g. vmas/navigation)"
        )
    if env_id.startswith("vmas/"):
        from rlstash.envs.vmas import make_vmas

        return make_vmas(env_id, num_envs, device, seed=seed, **(env_kwargs or {}))
    from rlstash.envs.pettingzoo import PettingZooVectorEnv

    n_workers = None if workers == "auto" else workers
    return PettingZooVectorEnv(env_id, num_envs, n_workers, seed, env_kwargs=env_kwargs, **options)


def make_batched_env(
    env_id: str,
    num_envs: int,
    workers: int | str,
    device: Any,
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


def make_eval_env(env_id: str, num_envs: int, history: int = 0, recorder: Any = None) -> Any:
    """Evaluation envs stepped in-process (evaluation is short and must not disturb training).
    ALE ids play full games with unclipped scores; with a ``recorder``
    (:class:`rlstash.train.video.Recorder`) env 0 renders and records the episodes it is
    asked to."""
    from gymnasium.vector import SyncVectorEnv

    factories = [factory(env_id, history, train=False)] * num_envs
    if recorder is not None:
        factories[0] = recorder.wrap(factory(env_id, history, train=False, render_mode="rgb_array"))
    return SyncVectorEnv(factories)


def make_pool_eval_env(
    env_id: str, num_envs: int, act_space: Any, clip: bool, recorder: Any = None
) -> Any:
    """An on-policy run's evaluation envs: an in-process ProcessPoolVectorEnv of
    :func:`env_source` factories (env 0 shares the ``recorder`` when given)."""
    from rlstash.envs.process_pool import ProcessPoolVectorEnv
    from rlstash.envs.registry import make

    source = env_source(env_id, act_space, clip, train=False)
    if recorder is not None:  # in-process envs: env 0 shares the recorder
        recorded = env_source(env_id, act_space, clip, False, render_mode="rgb_array")
        if isinstance(source, str):
            source = functools.partial(make, source)
        source = [recorder.wrap(recorded)] + [source] * (num_envs - 1)
    return ProcessPoolVectorEnv(source, num_envs=num_envs, num_workers=0)
