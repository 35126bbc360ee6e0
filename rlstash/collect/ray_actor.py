"""The body of one RayCollector actor: a vectorized env, a CPU policy copy, chunk replies.

:class:`ChunkActor` is a plain class; :class:`~rlstash.collect.ray.RayCollector` turns it into a
Ray actor (``ray.remote(ChunkActor).options(...)``) started with ``CUDA_VISIBLE_DEVICES=""`` in
its environment, so torch never sees a GPU there (invariant I1). Chunks are made by the local
:class:`~rlstash.collect.sync.Collector` over a :class:`~rlstash.envs.ProcessPoolVectorEnv`
(``workers=0``: the envs step in the actor's process), exactly as on one machine, and are
returned as numpy arrays: Ray moves them through its object store without pickling the data,
and a reader on the same node maps them without a copy.

One method does the work, so a request is a single round trip::

    reply = actor.collect(weights_box, version, steps, seed)

* ``seed`` not None: (re)build the envs and reset them with it (first request, and the first
  one after a failure: the driver then drops what the envs held). A restarted actor process
  has no envs; a request without a seed raises :class:`ActorNotStarted` there.
* ``version`` differs from the one loaded: ``ray.get(weights_box[0])`` (a list, so Ray does
  not fetch the weights with every request) and load them into the policy.
* ``steps`` (>= 1) env steps of every env.

The reply: ``data`` (``{field: [steps, n, ...]}``, the :class:`Collector`'s stream layout), ``next_obs`` [n, ...] (what the envs show now), ``version`` (the weights
the chunk was collected with), ``returns``/``lengths`` of the episodes that ended in it, and
where it ran: ``pid``, ``node_ip``, ``node_id``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


class ActorNotStarted(RuntimeError):
    """A request without a seed reached an actor without envs (its process was restarted)."""


class ChunkActor:
    """Steps ``num_envs`` envs with a CPU copy of the policy; see the module docstring."""

    def __init__(
        self, env: Any, policy_factory: Callable[[], Any], num_envs: int, workers: int
    ) -> None:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # also set by the driver before the process starts
        self.env_source, self.policy_factory = env, policy_factory
        self.num_envs, self.workers = num_envs, workers
        self.pool: Any = None
        self.collector: Any = None
        self.policy: Any = None
        self.version = -1
        self._episodes = 0

    def collect(self, weights_box: list, version: int, steps: int, seed: int | None) -> dict:
        """One chunk of ``steps`` steps of every env (see the module docstring)."""
        if seed is not None:
            self._start(seed)
        elif self.collector is None:
            raise ActorNotStarted(
                "this actor's process was restarted and holds no envs; the driver sends a seed"
            )
        if version != self.version:
            if weights_box:  # else: version 0, the factory's own weights
                import ray

                from rlstash.collect.async_weights import load_policy_state

                load_policy_state(self.policy, ray.get(weights_box[0]))
            self.version = version
        c = self.collector
        c.steps_per_batch = steps
        data = {k: v.numpy() for k, v in c.collect().items()}
        stats = c.stats
        new, self._episodes = stats.count - self._episodes, stats.count
        new = min(new, len(stats.returns))
        return {
            "data": data,
            "next_obs": c.next_obs.numpy(),
            "version": self.version,
            "returns": list(stats.returns)[len(stats.returns) - new :],
            "lengths": list(stats.lengths)[len(stats.lengths) - new :],
            **where(),
        }

    def _start(self, seed: int) -> None:
        """Build the policy (once) and fresh envs, reset with ``seed`` (env i: ``seed + i``)."""
        import torch

        from rlstash.collect.sync import Collector
        from rlstash.core import Acts
        from rlstash.envs import ProcessPoolVectorEnv

        if self.pool is not None:
            self.pool.close()
            self.pool = self.collector = None
        if self.policy is None:
            torch.set_num_threads(1)
            torch.manual_seed(seed)  # a factory may read torch.initial_seed() for its own seed
            self.policy = self.policy_factory()
            self.version = -1
        act = self.policy.act if isinstance(self.policy, Acts) else None
        policy = act if callable(act) else self.policy
        self.pool = ProcessPoolVectorEnv(
            self.env_source, num_envs=self.num_envs, num_workers=self.workers
        )
        self.collector = Collector(self.pool, policy, self.num_envs, device="cpu", seed=seed)
        if self.collector.same_step:
            raise ValueError(
                "env: RayCollector needs next-step autoreset (gymnasium's default), the env "
                "resets within the step; drop autoreset_mode='SameStep'"
            )
        self.collector.reset()
        self._episodes = 0

    def info(self) -> dict:
        """Where this actor runs and what its process sees of CUDA and torch."""
        import torch

        return {
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "cuda_available": torch.cuda.is_available(),
            "cuda_initialized": torch.cuda.is_initialized(),
            "version": self.version,
            "worker_pids": [] if self.pool is None else list(self.pool.worker_pids),
            **where(),
        }

    def close(self) -> None:
        """Stop the env workers (the driver then kills the actor)."""
        if self.pool is not None:
            self.pool.close()
            self.pool = self.collector = None


def where() -> dict[str, Any]:
    """This process's pid and its Ray node (ip and id)."""
    import ray

    return {
        "pid": os.getpid(),
        "node_ip": ray.util.get_node_ip_address(),
        "node_id": ray.get_runtime_context().get_node_id(),
    }
