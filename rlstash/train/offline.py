"""Training from a Minari dataset (``rlstash train --dataset NAME``; ``rlstash[minari]``).

Offline (``--algo iql`` or ``td3_bc``, store ``"offline"``): :class:`OfflineLearning` loads
the dataset into a one-lane stream replay (each observation once, planned before it is
allocated: :mod:`rlstash.datasets.minari`) and the loop only updates: ``--steps`` counts
gradient steps, ``--gradient-steps`` of them per round, ``--eval-every`` and
``--checkpoint-every`` count them too. Evaluation runs online in the env the dataset names
(its ``env_spec``). Checkpoints hold the agent, not the buffer (the dataset is read again on
resume).

Offline-to-online (``--dataset`` with an online algorithm, sac or td3): the run's replay is
seeded with the dataset's episodes before collection starts (:func:`seed_buffer`), dealt
over its ``--envs`` lanes; its capacity is ``--buffer-size`` plus the dataset's slots
(:func:`dataset_slots`), so the online steps overwrite the dataset only after
``--buffer-size`` of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlstash.device import resolve_device
from rlstash.envs.make import make_eval_env, make_vec_env
from rlstash.replay import ReplayBuffer
from rlstash.settings import field_values
from rlstash.storage import ReadSpec
from rlstash.train import checkpoint
from rlstash.train.run import Learning, Run, step_spec

DEFAULT_ENV = "CartPole-v1"  # TrainConfig.env's default: --dataset replaces it by its env


def with_dataset_env(cfg: Any) -> Any:
    """``cfg`` with ``env`` set to the env its ``dataset`` names (unchanged without one); a
    ValueError when ``--env`` names another env, or the dataset is no local Minari dataset.
    The ``with_dataset`` step of the learnings that use a dataset (replay, offline); the
    others refuse ``--dataset`` (:meth:`rlstash.train.run.Learning.with_dataset`)."""
    if not cfg.dataset:
        return cfg
    from rlstash.datasets import minari as mds

    env = mds.env_id(cfg.dataset)
    if cfg.env not in (DEFAULT_ENV, env):
        raise ValueError(
            f"env: dataset {cfg.dataset} was collected in {env}, got --env {cfg.env}; drop "
            f"--env (the dataset's env is used)"
        )
    return dataclasses.replace(cfg, env=env)


def _check_spaces(cfg: Any, ds: Any, info: Any) -> None:
    """A ValueError when the dataset's spaces are not the env's (shapes and action kind)."""

    def kinds(obs: Any, act: Any) -> tuple:
        return obs.shape, type(act).__name__, act.shape

    if kinds(ds.observation_space, ds.action_space) != kinds(info.obs_space, info.act_space):
        raise ValueError(
            f"dataset: {cfg.dataset} has observations {ds.observation_space} and actions "
            f"{ds.action_space}, env {cfg.env} has {info.obs_space} and {info.act_space}; "
            f"use a dataset of this env"
        )


def dataset_slots(cfg: Any, info: Any) -> int:
    """Slots the replay of an offline-to-online run adds to ``--buffer-size`` for the episodes
    of ``cfg.dataset``, dealt over its ``cfg.lanes`` lanes (each lane ``P`` slots more:
    :func:`rlstash.datasets.minari_fill.deal`); the memory plan counts both. A ValueError for
    mismatched spaces, frame-stacked observations or too few episodes for the lanes."""
    from rlstash.datasets import minari as mds
    from rlstash.datasets.minari_fill import deal

    if info.frame_stack > 1:
        raise ValueError(
            f"dataset: seeding a frame-stacked replay (--history or Atari, {info.frame_stack} "
            f"frames) from a dataset is not supported; drop --dataset or --history"
        )
    ds = mds.load(cfg.dataset)
    _check_spaces(cfg, ds, info)
    _, P = deal(mds.episode_lengths(ds), cfg.lanes)
    return P * cfg.lanes


def seed_buffer(rb: ReplayBuffer, cfg: Any) -> int:
    """Fill the fresh replay ``rb`` with the episodes of ``cfg.dataset`` before collection
    starts, dealt over its lanes (the slots :func:`dataset_slots` planned), each copied once
    into its slots; returns the steps written. The envs then collect into the same lanes,
    after the dataset's episodes."""
    from rlstash.datasets import minari as mds

    return mds.fill_dataset(rb, rb.storage, mds.load(cfg.dataset))


UNUSED = ("envs", "workers", "env_backend", "env_batch", "ray", "history", "storage",
          "buffer_size", "learning_starts", "train_freq", "compress")  # fmt: skip
"""Settings an offline run has no use for (no env is stepped; the replay is the dataset, in
memory on ``--buffer-device``): given another value than the default, they are refused.
(``ray_actors``, ``compress_budget`` and ``compress_delta`` need ``ray`` / ``compress``:
:class:`~rlstash.train.config.TrainConfig` refuses them alone.)"""


def check_offline_settings(cfg: Any) -> None:
    """A ValueError naming the first :data:`UNUSED` setting ``cfg`` gives (a value other than
    :class:`~rlstash.train.config.TrainConfig`'s default and the offline loop's own)."""
    from rlstash.train.algos import OFFLINE_LOOP
    from rlstash.train.config import TrainConfig

    defaults, given = field_values(TrainConfig()), field_values(cfg)
    for name in UNUSED:
        if given[name] not in (defaults[name], OFFLINE_LOOP.get(name, defaults[name])):
            raise ValueError(
                f"{name}: not used by offline --algo {cfg.algo} (no env is stepped; the replay "
                f"is the dataset, held on --buffer-device), got {given[name]!r}; drop "
                f"--{name.replace('_', '-')}"
            )


class OfflineLearning(Learning):
    """Updates only, on a replay filled from ``cfg.dataset`` (module docstring)."""

    name = "offline"

    def check(self, cfg: Any) -> None:
        if not cfg.dataset:
            raise ValueError(
                f"dataset: --algo {cfg.algo} learns offline from a dataset; give --dataset NAME "
                f"(a local Minari dataset id)"
            )
        check_offline_settings(cfg)

    def with_dataset(self, cfg: Any) -> Any:
        return with_dataset_env(cfg)

    def place(self, cfg: Any, device: torch.device) -> Any:
        resolve_device(cfg.buffer_device, "buffer_device")  # where the dataset is held
        return cfg

    def settings(self, cfg: Any, info: Any) -> dict[str, Any]:
        """The checkpoint's settings and the dataset's :func:`~rlstash.datasets.minari.
        fingerprint`: a resumed run reads the dataset again and checks it is the same."""
        from rlstash.datasets import minari as mds

        return {**super().settings(cfg, info), "dataset": mds.fingerprint(mds.load(cfg.dataset))}

    def make_env(self, cfg: Any, agent_cfg: Any, info: Any, device: torch.device, seed: int) -> Any:
        return make_vec_env(cfg.env, 1, 0, None, 0, device)  # never stepped: no collection

    def make_store(
        self, cfg: Any, agent_cfg: Any, info: Any, run_dir: Path, device: torch.device,
        state: dict[str, Any] | None,
    ) -> ReplayBuffer:  # fmt: skip
        from rlstash.datasets import minari as mds

        ds = mds.load(cfg.dataset)
        _check_spaces(cfg, ds, info)
        recorded = (state or {}).get("settings", {}).get("dataset")
        if recorded is not None and recorded != mds.fingerprint(ds):
            raise ValueError(
                f"dataset: {cfg.dataset} changed since the run's checkpoint (then: {recorded}; "
                f"now: {mds.fingerprint(ds)}); restore the dataset the run trained on, or "
                f"start a new run"
            )
        reads = ReadSpec(n_step=cfg.n_steps, gamma=agent_cfg.gamma)
        spec = step_spec(info.obs_space, info.act_space)
        where = resolve_device(cfg.buffer_device, "buffer_device")
        storage = mds.from_minari(ds, reads=reads, spec=spec, device=where)
        return ReplayBuffer(storage, seed=cfg.seed + (state["step"] if state else 0), device=device)

    def collect_frames(self, cfg: Any, agent_cfg: Any) -> int:
        return 1

    def planned_updates(self, cfg: Any, agent_cfg: Any, limiter: Any, frames: int) -> int:
        return cfg.steps

    def make_eval_env(
        self, cfg: Any, agent_cfg: Any, info: Any, num_envs: int, recorder: Any
    ) -> Any:
        return make_eval_env(cfg.env, num_envs, 0, recorder)

    def describe(self, run: Run) -> str:
        from rlstash.memory import human_bytes

        st = run.rb.storage
        return (
            f"offline: dataset {run.cfg.dataset} ({run.cfg.env}), {len(run.rb)} slots in a "
            f"stream replay, {human_bytes(st.nbytes)} on {st.device}; --steps counts updates"
        )

    def resumed(self, run: Run) -> str:
        return f"resumed at update {run.step}"

    def iterate(self, run: Run) -> Callable[[dict[str, Any]], dict[str, Any]]:
        cfg, agent, rb = run.cfg, run.agent, run.rb

        def iterate(metrics: dict[str, Any]) -> dict[str, Any]:
            for _ in range(min(cfg.gradient_steps, cfg.steps - run.step)):
                metrics = agent.update(rb.sample(cfg.batch_size))
                run.step += 1
            return metrics

        return iterate

    def save(self, run: Run) -> Path:
        return checkpoint.save(run.run_dir, run.state())

    def close_store(self, store: ReplayBuffer) -> None:
        store.close()


OFFLINE = OfflineLearning()
