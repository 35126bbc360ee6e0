"""Multi-agent off-policy training (QMIX, VDN): ``rlstash train --algo qmix --env vmas/navigation
--env-kwargs '{"continuous_actions": false}'`` or ``--env pettingzoo:<module>`` (discrete spaces).

::

    env = make_multiagent_env(...)                   # VMAS on the device / PettingZoo in the pool
    replay = ReplayBuffer(StreamStorage(agent_step_spec(A, D, S, n), E lanes, SameStep))
    while step < steps:
        replay.extend(collector.collect(agent))      # [T, E] steps of every agent, one write
        while limiter.can_sample():                  # gradient_steps per train_freq env steps
            agent.update(replay.sample(batch_size))  # [B, A, ...]
        evaluate / checkpoint (with the replay) / log at their intervals (rlstash.train.drive)

:data:`MARL_REPLAY` is the :class:`~rlstash.train.run.Learning` of the algorithms whose registry
entry says ``store="marl_replay"``. It is :class:`~rlstash.train.marl.MultiAgentLearning`
(probe, env, evaluation, checkpoint settings: the same hooks) with a replay instead of a
rollout: ``make_store`` (the stream, planned to the byte before it allocates; restored from the
checkpoint on ``--resume``), ``make_limiter``, ``make_collector``, ``iterate`` and ``save``
differ. Frames count env steps (each with all its agents), as BenchMARL counts them; ``--envs``
sets the stream's lanes (default: the agent's ``num_envs``, BenchMARL's 10). Agents with
continuous actions are refused at the probe, naming the fix. :func:`plan_stream` is
``rlstash plan --algo qmix``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from gymnasium import spaces

from rlstash.collect.marl_stream import MultiAgentStreamCollector
from rlstash.ratelimit import RateLimiter
from rlstash.replay import ReplayBuffer
from rlstash.spec import Spec
from rlstash.storage.stream import ReadSpec, StreamStorage
from rlstash.storage.stream_agents import agent_step_spec
from rlstash.train import checkpoint, run_memory
from rlstash.train.marl import MultiAgentInfo, MultiAgentLearning, env_kwargs
from rlstash.train.run import Run

if TYPE_CHECKING:
    from rlstash.memory import MemoryPlan

STORAGES = ("ram", "disk")


@dataclass
class StreamInfo(MultiAgentInfo):
    """A :class:`MultiAgentInfo` that also knows whether the env gives action masks."""

    has_action_mask: bool = False


def stream_spec(info: StreamInfo) -> Spec:
    """The stream step of the run's agents (:func:`agent_step_spec`)."""
    n = int(info.act_space.n) if info.has_action_mask else None
    return agent_step_spec(info.n_agents, info.obs_dim, info.state_dim, n)


def capacity_of(cfg: Any) -> int:
    """Slots of the run's stream: ``buffer_size`` rounded down to whole lanes (>= one each)."""
    return max(cfg.envs, cfg.buffer_size // cfg.envs * cfg.envs)


class MultiAgentReplayLearning(MultiAgentLearning):
    """QMIX/VDN: steps of every agent into a stream replay, rate-limited updates on samples."""

    name = "marl_replay"

    def check(self, cfg: Any) -> None:
        for name, bad in (("history", cfg.history), ("ray", cfg.ray), ("video", cfg.video)):
            if bad:
                raise ValueError(
                    f"{name}: not supported by --algo {cfg.algo} (multi-agent runs); drop --{name}"
                )
        if cfg.storage not in STORAGES:
            raise ValueError(
                f"storage: --algo {cfg.algo} keeps its replay in {' or '.join(STORAGES)}, got "
                f"{cfg.storage!r}; give --storage ram or --storage disk"
            )
        if cfg.compress != "none":
            raise ValueError(
                f"compress: --algo {cfg.algo} stores vector observations, not frames; drop "
                f"--compress {cfg.compress}"
            )

    def probe(self, cfg: Any) -> StreamInfo:
        from rlstash.train.marl import make_env

        env = make_env(cfg, 1, torch.device("cpu"), cfg.seed)  # spaces, masks (any device)
        try:
            if len(env.groups) != 1:
                raise ValueError(
                    f"env {cfg.env}: has agent groups {sorted(env.groups)} (agents with "
                    f"different spaces); --algo {cfg.algo} trains one group: pick an env whose "
                    "agents are alike"
                )
            group = next(iter(env.groups))
            act_space = env.action_spaces[group]
            if not isinstance(act_space, spaces.Discrete):
                fix = (
                    "--env-kwargs '{\"continuous_actions\": false}' (VMAS's discrete actions)"
                    if cfg.env.startswith("vmas/")
                    else "an env whose agents have Discrete action spaces"
                )
                raise ValueError(
                    f"env {cfg.env}: agents have continuous actions {act_space}; --algo "
                    f"{cfg.algo} needs discrete ones: give {fix}, or use --algo mappo"
                )
            first = env.reset(seed=cfg.seed)
            return StreamInfo(
                env.observation_spaces[group], act_space, None,
                n_agents=len(env.groups[group]), state_space=env.state_space,
                has_action_mask=first.action_mask[group] is not None,
            )  # fmt: skip
        finally:
            env.close()

    def resolve(self, cfg: Any, agent_cfg: Any, given: dict[str, Any]) -> tuple[Any, Any]:
        changes: dict[str, Any] = {}
        if cfg.envs > 1:
            changes["num_envs"] = cfg.envs
        if "total_steps" not in given:
            changes["total_steps"] = cfg.steps
        agent_cfg = dataclasses.replace(agent_cfg, **changes)
        cfg = dataclasses.replace(cfg, envs=agent_cfg.num_envs, agent={**cfg.agent, **changes})
        cfg.check_replay()  # the lanes of the stream at the run's envs
        return cfg, agent_cfg

    def place(self, cfg: Any, device: torch.device) -> Any:
        if cfg.env.startswith("vmas/"):  # its steps stay on its device: the replay lives there
            cfg = dataclasses.replace(cfg, buffer_device=str(device))
        return cfg

    def make_store(
        self, cfg: Any, agent_cfg: Any, info: MultiAgentInfo, run_dir: Path,
        device: torch.device, state: dict[str, Any] | None,
    ) -> ReplayBuffer:  # fmt: skip
        from rlstash.device import resolve_device
        from rlstash.memory import InsufficientMemoryError

        if state is not None:
            path = run_dir / checkpoint.NAME / checkpoint.BUFFER
            with checkpoint.reading(path):
                return ReplayBuffer.load(path, device=device)
        capacity = capacity_of(cfg)
        disk = cfg.storage == "disk"
        try:  # planned and checked before anything is allocated (I2): one line naming the flags
            st = StreamStorage(
                stream_spec(info), cfg.envs, capacity, backing="disk" if disk else "ram",
                device="cpu" if disk else resolve_device(cfg.buffer_device, "buffer_device"), path=run_dir / "buffer" if disk
                else None, autoreset="SameStep",
                reads=ReadSpec(n_step=cfg.n_steps, gamma=agent_cfg.gamma),
            )  # fmt: skip
        except InsufficientMemoryError as exc:
            raise run_memory.buffer_refusal(exc, cfg, capacity) from None
        return ReplayBuffer(st, seed=cfg.seed, device=device)

    def make_limiter(self, cfg: Any) -> RateLimiter:
        return RateLimiter(
            min_size=max(cfg.learning_starts, cfg.batch_size, cfg.envs * (cfg.n_steps + 1)),
            samples_per_insert=cfg.gradient_steps * cfg.batch_size / cfg.train_freq,
            batch_size=cfg.batch_size,
            insert_chunk=self.collect_frames(cfg, None),
        )

    def collect_frames(self, cfg: Any, agent_cfg: Any) -> int:
        return max(1, cfg.train_freq // cfg.envs) * cfg.envs

    def planned_updates(self, cfg: Any, agent_cfg: Any, limiter: Any, frames: int) -> int:
        return max(0, cfg.steps - limiter.min_size) * cfg.gradient_steps // cfg.train_freq

    def make_collector(
        self, cfg: Any, agent_cfg: Any, info: MultiAgentInfo, env: Any, agent: Any,
        limiter: Any, frames: int, seed: int,
    ) -> tuple[MultiAgentStreamCollector, None]:  # fmt: skip
        return MultiAgentStreamCollector(env, frames // cfg.envs, seed=seed), None

    def settings(self, cfg: Any, info: MultiAgentInfo) -> dict[str, Any]:
        return {**super().settings(cfg, info), "mixer": cfg.agent.get("mixer"),
                "share_params": cfg.agent.get("share_params")}  # fmt: skip

    def describe(self, run: Run) -> str:
        from rlstash.agents.nets import param_bytes
        from rlstash.memory import human_bytes

        st, agent, c = run.rb.storage, run.agent, run.collector
        nets = param_bytes(agent.nets["q"], agent.nets["mixer"])
        lines = [
            f"env: {run.cfg.env} {json.dumps(env_kwargs(run.cfg))}, {c.num_envs} envs x "
            f"{c.n_agents} agents on {run.env.device}",
            f"replay: StreamStorage of {st.capacity:,} slots over {st.num_envs} envs (a slot: "
            f"one env step of every agent), {human_bytes(st.nbytes)} on {st.device}",
        ]
        if st.plan is not None:
            lines.append(st.plan.format_table())
        lines.append(
            f"networks ({agent.algo}, shared parameters: {agent.config.share_params}): "
            f"{human_bytes(nets)} of parameters on {agent.device} (x~5 with targets, Adam "
            "state and gradients)"
        )
        return "\n".join(lines)

    def resumed(self, run: Run) -> str:
        return f"resumed at step {run.step} with {len(run.rb)} stored slots"

    def iterate(self, run: Run) -> Callable[[dict[str, Any]], dict[str, Any]]:
        cfg, agent, rb, limiter = run.cfg, run.agent, run.rb, run.limiter
        names = run.env.groups[run.collector.group]

        def iterate(metrics: dict[str, Any]) -> dict[str, Any]:
            rb.extend(run.collector.collect(agent))
            limiter.on_insert(run.frames_per_collect)
            run.step += run.frames_per_collect
            while limiter.can_sample():
                metrics = agent.update(rb.sample(cfg.batch_size))
                limiter.on_sample()
            stats = run.collector.stats
            per_agent = stats.total / stats.episodes.clamp_min(1)  # [A], read when logged
            per_agent = torch.where(stats.episodes > 0, per_agent, float("nan"))
            return {**metrics, **{f"return_{a}": per_agent[i] for i, a in enumerate(names)}}

        return iterate

    def save(self, run: Run) -> Path:
        return checkpoint.save(run.run_dir, run.state(), run.rb)

    def close_store(self, store: ReplayBuffer) -> None:
        with contextlib.suppress(Exception):
            store.close()


MARL_REPLAY = MultiAgentReplayLearning()


def plan_stream(cfg: Any, device: torch.device) -> tuple[MemoryPlan, dict[str, Any]]:
    """(the memory plan of the stream a run of ``cfg`` allocates on ``device``, its sizes),
    settings resolved as ``rlstash train`` resolves them and the env probed; nothing is
    allocated. The bytes are those :class:`StreamStorage` checks itself with."""
    from rlstash.memory import plan
    from rlstash.storage.stream_plan import BOOKKEEPING, bookkeeping_bytes
    from rlstash.storage.stream_spec import slot_spec
    from rlstash.train import algos

    MARL_REPLAY.check(cfg)
    info = MARL_REPLAY.probe(cfg)
    given = dict(cfg.agent)
    cfg, agent_cfg = algos.resolve(cfg, info.act_space)
    cfg, agent_cfg = MARL_REPLAY.resolve(cfg, agent_cfg, given)
    spec, slots = stream_spec(info), capacity_of(cfg)
    overhead = {BOOKKEEPING: bookkeeping_bytes(cfg.envs, slots)}
    result = plan(slot_spec(spec), slots, "ram", device, overhead=overhead)
    return result, {"spec": spec, "slots": slots, "num_envs": cfg.envs,
                    "n_agents": info.n_agents}  # fmt: skip


__all__ = [
    "MARL_REPLAY",
    "MultiAgentReplayLearning",
    "StreamInfo",
    "capacity_of",
    "plan_stream",
    "stream_spec",
]
