"""The on-policy training loop (PPO): how collection and updates alternate, in one place.

::

    while step < steps and not solved:
        batch = collector.collect()               # T steps of N envs, by the current policy
        rollout.add(batch, collector.next_obs)    # [T, N] where the env data arrives (+ obs after)
        metrics = agent.update(rollout)           # n_epochs of shuffled minibatches, then done
        step += T * N
        evaluate / checkpoint / log at their intervals (excluded from train_seconds)

Collection and learning strictly alternate: each rollout is collected by exactly the policy
that is then updated on it, and is used by that one update only (no replay buffer, no rate
limiter: ``samples_per_insert`` is fixed at ``n_epochs`` by construction). N is ``--envs``
when given (> 1), else the agent's ``num_envs`` (the env's preset: 8 for CartPole-v1); T is
``rollout_steps``. The stopping rule, evaluation, checkpoints (agent with its normalisation
statistics, counters and RNG states), plots and telemetry are those of
:mod:`rlstash.train.loop`.
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
from rlstash.envs import ProcessPoolVectorEnv, registry
from rlstash.spec import Field, Spec
from rlstash.storage.rollout import RolloutStorage
from rlstash.train import algos, builders, checkpoint, video

ALGOS = ("ppo",)


@dataclass
class OnPolicyRun:
    """The objects of one on-policy run, built (or restored) before the first step."""

    cfg: Any  # resolved TrainConfig
    run_dir: Path
    threshold: float | None
    device: torch.device
    env: Any
    agent: Any
    rollout: RolloutStorage
    collector: Collector
    eval_collector: Collector
    step: int = 0
    train_seconds: float = 0.0
    evals: list[dict[str, Any]] = field(default_factory=list)
    recorder: video.Recorder | None = None  # --video: records an episode per evaluation
    settings: dict[str, Any] = field(default_factory=dict)  # checked when a checkpoint loads

    @property
    def frames_per_collect(self) -> int:
        return self.collector.steps_per_batch * self.collector.num_envs

    def describe(self) -> str:
        from rlstash.agents.nets import param_bytes
        from rlstash.memory import human_bytes

        nets = param_bytes(*self.agent.nets.values())
        return (
            f"rollout: {self.rollout.steps} steps x {self.rollout.num_envs} envs, "
            f"{human_bytes(self.rollout.nbytes)} on {self.rollout.device}\n"
            f"networks: {human_bytes(nets)} of parameters on {self.agent.device} "
            "(x~4 with Adam state and gradients)"
        )

    def close(self) -> None:
        self.env.close()
        self.eval_collector.env.close()

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds (no buffer: a rollout is used once)."""
        return {
            "step": self.step,
            "train_seconds": self.train_seconds,
            "config": dataclasses.asdict(self.cfg),
            "agent": self.agent.state_dict(),
            "evals": self.evals,
            "settings": self.settings,
        }


def build_onpolicy_run(cfg: Any, run_dir: Path, state: dict[str, Any] | None = None) -> OnPolicyRun:
    """Env, agent, rollout storage and collectors of an on-policy run (module docstring);
    settings are checked before ``run_dir`` is created, a run refused later removes it."""
    torch.set_num_threads(cfg.torch_threads)
    if cfg.history:
        raise ValueError(f"history: not supported by --algo {cfg.algo}; drop --history")
    info = builders.probe_env(cfg.env)
    given = dict(cfg.agent)
    cfg, agent_cfg = algos.resolve(cfg, info.act_space)
    _check_loop_settings(cfg)
    if "total_steps" not in given:  # anneal over this run unless told otherwise
        agent_cfg = dataclasses.replace(agent_cfg, total_steps=cfg.steps)
        cfg = dataclasses.replace(cfg, agent={**cfg.agent, "total_steps": cfg.steps})
    device = builders.resolve_device(cfg.device, "device")
    if cfg.video:
        video.check_available()
    step = state["step"] if state else 0
    with contextlib.ExitStack() as undo:  # a refused run closes what it built
        if not run_dir.exists():
            top = run_dir
            while not top.parent.exists():
                top = top.parent
            undo.callback(shutil.rmtree, top, ignore_errors=True)
            run_dir.mkdir(parents=True)
        num_envs = algos.rollout_envs(cfg, agent_cfg)
        source = _env_source(cfg.env, info.act_space, agent_cfg)
        # same-step autoreset: every row a real step (next-step mode spends a row per episode
        # end on a reset step); final observations come with the batch for bootstrapping
        batched = builders.is_batched(cfg.env)  # a torch env: its tensors stay on `device`
        if batched:
            env = builders.make_batched_env(cfg.env, num_envs, cfg.workers, device, same_step=True)
        else:
            env = ProcessPoolVectorEnv(
                source, num_envs=num_envs, num_workers=cfg.workers, autoreset_mode="SameStep"
            )
        undo.callback(env.close)
        agent = builders.make_agent(cfg, agent_cfg, info, device)
        frames = agent_cfg.rollout_steps * num_envs
        per_rollout = agent_cfg.n_epochs * -(-frames // agent_cfg.minibatch_size)
        agent.planned_updates = -(-cfg.steps // frames) * per_rollout  # compile="auto" reads it
        collector = Collector(env, agent.act, frames, device=agent.act_device, seed=cfg.seed + step)
        rollout = RolloutStorage(
            _step_spec(info.obs_space, info.act_space), agent_cfg.rollout_steps, num_envs,
            device=device if batched else "cpu", same_step=collector.same_step,
        )  # fmt: skip
        n_eval = min(cfg.eval_episodes, 10)
        eval_source = _env_source(cfg.env, info.act_space, agent_cfg, train=False)
        recorder = video.Recorder(run_dir / "videos") if cfg.video else None
        if recorder is not None:  # in-process envs: env 0 shares the recorder
            recorded = _env_source(
                cfg.env, info.act_space, agent_cfg, False, render_mode="rgb_array"
            )
            if isinstance(eval_source, str):
                eval_source = functools.partial(registry.make, eval_source)
            eval_source = [recorder.wrap(recorded)] + [eval_source] * (n_eval - 1)
        eval_env = ProcessPoolVectorEnv(eval_source, num_envs=n_eval, num_workers=0)
        undo.callback(eval_env.close)
        eval_collector = Collector(eval_env, agent.act, n_eval, device=agent.act_device)
        threshold = cfg.threshold
        if threshold is None:
            threshold = builders.DEFAULT_THRESHOLDS.get(cfg.env, info.threshold)
        run = OnPolicyRun(cfg, run_dir, threshold, device, env, agent, rollout, collector,
                          eval_collector, recorder=recorder)  # fmt: skip
        run.settings = checkpoint.settings(cfg, info)
        if state is not None:
            with checkpoint.reading(run_dir / checkpoint.NAME / checkpoint.STATE):
                agent.load_state_dict(state["agent"])
                run.train_seconds, run.evals = state["train_seconds"], state["evals"]
            run.step = step
        undo.pop_all()
    return run


def _check_loop_settings(cfg: Any) -> None:
    """Refuse what an on-policy run has no use for (replay settings)."""
    if cfg.storage != "ram":
        raise ValueError(
            f"storage: --algo {cfg.algo} keeps one rollout in memory and has no replay "
            f"storage; drop --storage {cfg.storage}"
        )
    if cfg.compress != "none":
        raise ValueError(
            f"compress: --algo {cfg.algo} keeps one rollout in memory, not a replay of "
            f"frames; drop --compress {cfg.compress}"
        )
    for name, instead in (("batch_size", "minibatch_size"), ("n_steps", "rollout_steps"),
                          ("buffer_size", None), ("learning_starts", None),
                          ("train_freq", "rollout_steps"), ("gradient_steps", "n_epochs")):  # fmt: skip
        if getattr(cfg, name) is not None:
            fix = f"give --{instead.replace('_', '-')} instead" if instead else "drop it"
            raise ValueError(f"{name}: a replay setting, not used by --algo {cfg.algo}; {fix}")


def _env_source(
    env_id: str, act_space: Any, agent_cfg: Any, train: bool = True, **kwargs: Any
) -> Any:
    """A factory of the run's env: ALE ids preprocessed for training or evaluation
    (:mod:`rlstash.envs.atari`), ClipAction added for a Gaussian policy with bound 'clip';
    else the id itself (the pool makes it) unless ``kwargs`` are given."""
    from gymnasium import spaces

    from rlstash.envs.atari import is_atari, make_atari
    from rlstash.envs.history import make_clipped
    from rlstash.envs.registry import make

    if is_atari(env_id):
        return functools.partial(make_atari, env_id, train, **kwargs)
    if isinstance(act_space, spaces.Box) and agent_cfg.bound == "clip":
        return functools.partial(make_clipped, env_id, **kwargs)
    return functools.partial(make, env_id, **kwargs) if kwargs else env_id


def _step_spec(obs_space: Any, act_space: Any) -> Spec:
    from gymnasium import spaces

    obs = Field(tuple(obs_space.shape), obs_space.dtype)
    if isinstance(act_space, spaces.Discrete):
        return Spec({"obs": obs, "action": Field((), torch.int64)})
    return Spec({"obs": obs, "action": Field(tuple(act_space.shape), torch.float32)})


def run_loop(run: OnPolicyRun, log: Any) -> Any:
    """The loop of the module docstring; returns a :class:`rlstash.train.loop.TrainResult`."""
    from rlstash.train.loop import drive

    log.info(f"run directory: {run.run_dir}")
    log.info(run.describe())
    if run.step:
        log.info(f"resumed at step {run.step}")

    def iterate(metrics: dict[str, Any]) -> dict[str, Any]:
        run.rollout.add(run.collector.collect(), run.collector.next_obs)
        metrics = run.agent.update(run.rollout)
        run.step += run.frames_per_collect
        return metrics

    return drive(run, log, iterate, lambda: checkpoint.save(run.run_dir, run.state()))
