"""One training run's objects (:class:`Run`) and what differs between off- and on-policy
learning (:class:`Learning`), below the set-up (:mod:`.builders`) and the loop (:mod:`.loop`).

An algorithm's registry entry names its store (:attr:`rlstash.train.algos.Algo.store`); the
store's :class:`Learning` (``builders.REPLAY``: a replay buffer and a rate limiter;
``onpolicy.ROLLOUT``: one rollout per update) supplies the steps of
:func:`rlstash.train.builders.build_run` and of the loop that differ; everything else is
shared.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlstash.spec import Field, Spec


class Learning:
    """The steps of a run's set-up and loop that depend on how it learns (off-policy from a
    replay, on-policy from rollouts). Subclasses: ``builders.ReplayLearning``,
    ``onpolicy.RolloutLearning``."""

    name = ""

    def check(self, cfg: Any) -> None:
        """Refuse settings this kind of learning has no use for, before the env is probed."""

    def resolve(self, cfg: Any, agent_cfg: Any, given: dict[str, Any]) -> tuple[Any, Any]:
        """Adjust the resolved settings (``given``: the agent settings the user gave)."""
        return cfg, agent_cfg

    def place(self, cfg: Any, device: torch.device) -> Any:
        """Settings that follow from the learner's device."""
        return cfg

    def make_env(self, cfg: Any, agent_cfg: Any, info: Any, device: torch.device) -> Any:
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


def make_run_dir(run_dir: Path, undo: contextlib.ExitStack) -> None:
    """Create ``run_dir`` (and its missing parents) with ``undo`` removing what was created."""
    if not run_dir.exists():
        top = run_dir  # the outermost directory this run creates
        while not top.parent.exists():
            top = top.parent
        undo.callback(shutil.rmtree, top, ignore_errors=True)
        run_dir.mkdir(parents=True)
