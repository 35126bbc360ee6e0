"""One training run's objects (:class:`Run`) and what differs between the ways of learning
(:class:`Learning`), below the set-up (:mod:`.builders`) and the loop (:mod:`.loop`).

An algorithm's registry entry names its store (:attr:`rlstash.train.algos.Algo.store`); the
store's :class:`Learning` (``builders.REPLAY``: a replay buffer and a rate limiter;
``onpolicy.ROLLOUT``: one rollout per update; ``offline.OFFLINE``: a dataset, updates only;
``marl.MULTIAGENT``: a [T, E, A] rollout of every agent) supplies the steps of
:func:`rlstash.train.builders.build_run` and of the loop that differ; everything else is
shared. The hooks' defaults here are those of the single-agent gymnasium-style runs (an
:class:`~rlstash.envs.make.EnvInfo` from ``probe_env``, a :class:`Collector`, the agent built by
its learner); a learning overrides only what it does differently.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlstash.collect.sync import Collector
from rlstash.envs import make as envs_make
from rlstash.spec import Field, Spec
from rlstash.train import algos, checkpoint, ray_run, run_memory


class Learning:
    """The steps of a run's set-up and loop that depend on how it learns (off-policy from a
    replay, on-policy from rollouts, offline from a dataset, multi-agent). Subclasses:
    ``builders.ReplayLearning``, ``onpolicy.RolloutLearning``, ``offline.OfflineLearning``,
    ``marl.MultiAgentLearning``."""

    name = ""
    same_step = False  # its env needs same-step autoreset (every row a real step)
    uses_env_kwargs = False  # --env-kwargs reaches its envs (the multi-agent learnings)

    def check(self, cfg: Any) -> None:
        """Refuse settings this kind of learning has no use for, before the env is probed."""

    def check_env_kwargs(self, cfg: Any) -> None:
        """Refuse ``--env-kwargs`` where this learning's envs would not get them."""
        if cfg.env_kwargs and not self.uses_env_kwargs:
            raise ValueError(
                f"env_kwargs: reach multi-agent envs (vmas/<scenario>, pettingzoo:<module>) "
                f"only, not {cfg.env}, got {cfg.env_kwargs!r}; register a gymnasium id with "
                f"them (gymnasium.register(id, entry_point, kwargs=...) in your module) and "
                f"give --env your_module:YourId-v0, or drop --env-kwargs"
            )

    def with_dataset(self, cfg: Any) -> Any:
        """``cfg`` with the env its ``--dataset`` names; by default a dataset is refused (the
        learnings that use one: replay, offline)."""
        if cfg.dataset:
            raise ValueError(
                f"dataset: --algo {cfg.algo} learns on-policy, from its own rollouts only; use "
                f"--algo iql or td3_bc (offline) or sac or td3 (seeded with the dataset)"
            )
        return cfg

    def probe(self, cfg: Any) -> Any:
        """What the other steps need to know of the env before any is made (spaces, reward
        threshold): an :class:`~rlstash.envs.make.EnvInfo`; refuses an unknown env id. No
        device is resolved yet (settings are refused before any CUDA call)."""
        return envs_make.probe_env(cfg.env, cfg.history)

    def pick_backend(self, cfg: Any) -> tuple[Any, str]:
        """(``cfg`` with the env backend that runs recorded, why that one)."""
        backend, why = envs_make.resolve_backend(
            cfg.env_backend, cfg.env, cfg.history, self.same_step, bool(cfg.ray)
        )
        return dataclasses.replace(cfg, env_backend=backend), why

    def env_note(self, cfg: Any, why: str, env: Any) -> str:
        """The start-up line naming the env, its backend and why (empty: none)."""
        return envs_make.describe_env(cfg.env, cfg.env_backend, why, env)

    def settings(self, cfg: Any, info: Any) -> dict[str, Any]:
        """What a checkpoint records and checks when it is loaded (the networks' shapes)."""
        return checkpoint.settings(cfg, info)

    def make_agent(self, cfg: Any, agent_cfg: Any, info: Any, device: torch.device) -> Any:
        """The algorithm's learner for the env's spaces (:func:`make_agent`)."""
        return make_agent(cfg, agent_cfg, info, device)

    def make_collector(
        self, cfg: Any, agent_cfg: Any, info: Any, env: Any, agent: Any, limiter: Any,
        frames: int, seed: int,
    ) -> tuple[Any, Callable[[Run], None] | None]:  # fmt: skip
        """(the run's collector of ``frames`` env steps per batch, how the learner's policy
        reaches it): :func:`make_collector`."""
        return make_collector(cfg, agent_cfg, info, env, agent, limiter, frames, seed)

    def make_eval(self, cfg: Any, agent_cfg: Any, info: Any, agent: Any, recorder: Any) -> Any:
        """The evaluation collector (``.rollout(agent, episodes, deterministic, seed)``, its
        envs at ``.env``): a :class:`Collector` of up to 10 envs of :meth:`make_eval_env`."""
        n_eval = min(cfg.eval_episodes, 10)
        eval_env = self.make_eval_env(cfg, agent_cfg, info, n_eval, recorder)
        return Collector(eval_env, agent.act, n_eval, device=agent.act_device)

    def resolve(self, cfg: Any, agent_cfg: Any, given: dict[str, Any]) -> tuple[Any, Any]:
        """Adjust the resolved settings (``given``: the agent settings the user gave)."""
        return cfg, agent_cfg

    def place(self, cfg: Any, device: torch.device) -> Any:
        """Settings that follow from the learner's device."""
        return cfg

    def make_env(self, cfg: Any, agent_cfg: Any, info: Any, device: torch.device, seed: int) -> Any:
        """The envs the collector steps (``seed``: the run's seed plus the steps done)."""
        raise NotImplementedError

    def make_store(
        self, cfg: Any, agent_cfg: Any, info: Any, run_dir: Path, device: torch.device,
        state: dict[str, Any] | None,
    ) -> Any:  # fmt: skip
        raise NotImplementedError

    def make_limiter(self, cfg: Any) -> Any:
        """The rate limiter of updates per inserted frame (None: updates follow collection)."""
        return None

    def collect_frames(self, cfg: Any, agent_cfg: Any) -> int:
        raise NotImplementedError

    def planned_updates(self, cfg: Any, agent_cfg: Any, limiter: Any, frames: int) -> int:
        raise NotImplementedError

    def make_eval_env(
        self, cfg: Any, agent_cfg: Any, info: Any, num_envs: int, recorder: Any
    ) -> Any:
        raise NotImplementedError

    def describe(self, run: Run) -> str:
        """What the run holds in memory (printed at start)."""
        raise NotImplementedError

    def resumed(self, run: Run) -> str:
        return f"resumed at step {run.step}"

    def iterate(self, run: Run) -> Callable[[dict[str, Any]], dict[str, Any]]:
        """The loop's step (:func:`rlstash.train.drive.drive`): collect, learn, advance."""
        raise NotImplementedError

    def save(self, run: Run) -> Path:
        """Write a checkpoint of the run."""
        raise NotImplementedError

    def close_store(self, store: Any) -> None:
        """Release the store (files, shared memory) when the run ends."""


@dataclass
class Run:
    """The objects of one run, built (or restored) before the first step, and its counters."""

    cfg: Any  # the resolved TrainConfig: every loop setting filled in, ``agent`` complete
    run_dir: Path
    threshold: float | None
    device: torch.device
    env: Any  # with Ray, the RayCollector (closing the run closes it)
    store: Any  # a ReplayBuffer (store "replay") or a RolloutStorage (store "rollout")
    agent: Any
    collector: Any  # a Collector, or with --ray a RayCollector
    eval_collector: Any
    learning: Learning
    limiter: Any = None  # a RateLimiter (store "replay")
    step: int = 0
    train_seconds: float = 0.0
    evals: list[dict[str, Any]] = field(default_factory=list)
    recorder: Any = None  # --video: a rlstash.train.video.Recorder, an episode per evaluation
    settings: dict[str, Any] = field(default_factory=dict)  # checked when a checkpoint loads
    publish: Callable[[Run], None] | None = None  # --ray: the learner's policy to the actors
    env_note: str = ""  # the start-up line naming the env backend that runs and why

    @property
    def rb(self) -> Any:
        """The replay buffer (store "replay")."""
        return self.store

    @property
    def rollout(self) -> Any:
        """The rollout storage (store "rollout")."""
        return self.store

    @property
    def frames_per_collect(self) -> int:
        return self.collector.steps_per_batch * self.collector.num_envs

    def describe(self) -> str:
        return self.learning.describe(self)

    def close(self) -> None:
        self.env.close()
        self.eval_collector.env.close()
        self.learning.close_store(self.store)

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds besides the buffer."""
        state = {
            "step": self.step,
            "train_seconds": self.train_seconds,
            "config": dataclasses.asdict(self.cfg),
            "agent": self.agent.state_dict(),
        }
        if self.limiter is not None:
            state["limiter"] = self.limiter.state_dict()
        return {**state, "evals": self.evals, "settings": self.settings}


def step_spec(obs_space: Any, act_space: Any) -> Spec:
    """What a collector step stores: obs and action (reward and flags are the stores' own)."""
    from gymnasium import spaces

    obs = Field(tuple(obs_space.shape), obs_space.dtype)
    if isinstance(act_space, spaces.Discrete):
        action = Field((), torch.int64)  # an index, never one-hot (seed 004)
    else:
        action = Field(tuple(act_space.shape), torch.float32)
    return Spec({"obs": obs, "action": action})


def make_agent(cfg: Any, agent_cfg: Any, info: Any, device: torch.device) -> Any:
    """The algorithm's learner for the env's action space (``cfg`` resolved); networks that
    do not fit are refused before they are built, naming the flags (:mod:`.run_memory`)."""
    learner = algos.ALGOS[cfg.algo].learner(info.act_space, cfg.env)
    build = functools.partial(
        learner.build, tuple(info.obs_space.shape), info.act_space, agent_cfg, device
    )
    run_memory.check_agent(build)
    return build()


def make_collector(
    cfg: Any, agent_cfg: Any, info: Any, env: Any, agent: Any, limiter: Any, frames: int,
    seed: int,
) -> tuple[Any, Callable[[Run], None] | None]:  # fmt: skip
    """(the run's collector of ``frames`` env steps per batch, how the learner's policy
    reaches it): a :class:`Collector` stepping ``env`` with the agent itself in this process,
    or with ``--ray`` a RayCollector whose actors hold the envs and CPU copies of the agent
    (``ray_run.publish`` sends them the learner's policy)."""
    if cfg.ray:
        collector = ray_run.make_collector(cfg, agent_cfg, info, limiter, frames, seed, make_agent)
        return collector, ray_run.publish
    return Collector(env, agent.act, frames, device=agent.act_device, seed=seed), None


def make_run_dir(run_dir: Path, undo: contextlib.ExitStack) -> None:
    """Create ``run_dir`` (and its missing parents) with ``undo`` removing what was created."""
    if not run_dir.exists():
        top = run_dir  # the outermost directory this run creates
        while not top.parent.exists():
            top = top.parent
        undo.callback(shutil.rmtree, top, ignore_errors=True)
        run_dir.mkdir(parents=True)
