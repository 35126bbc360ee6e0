"""RayCollector: collection on a Ray cluster, batches in the stream layout as on one machine.

::

    collector = RayCollector("CartPole-v1", make_policy, num_actors=4, envs_per_actor=8,
                             frames_per_batch=4 * 8 * 32, seed=0, address="local")
    with collector:
        for batch in collector:              # [T, N] stream layout, N = 4 * 8 lanes
            rb.extend(batch)                 # StreamStorage(num_envs=N) takes it as is
            limiter.on_insert(len(batch["reward"]) * collector.num_envs)
            ...train...
            collector.update_policy_weights(agent.policy_state_dict())

How it works:

* Each Ray actor (:class:`~rlstash.collect.ray_actor.ChunkActor`) steps ``envs_per_actor``
  envs (a :class:`~rlstash.envs.ProcessPoolVectorEnv` with ``workers_per_actor`` worker
  processes, or in the actor's process with 0) with a CPU copy of the policy built by
  ``policy_factory()`` in a process started with ``CUDA_VISIBLE_DEVICES=""``. It returns
  chunks of T steps as numpy arrays: out of the object store without a copy on the same node.
* The driver keeps one request in flight per actor and ``ray.wait``s for whichever is ready
  first; each actor may run at most one chunk ahead of the batch being assembled, so at most
  ``2 * num_actors`` chunks exist at any time and the object store stays flat however long
  the run. A batch is one chunk of every actor side by side: lanes ``a * n .. (a + 1) * n - 1``
  are actor ``a``'s envs, always the same, so each lane's batches follow each other in time.
* Back-pressure: with a ``rate_limiter`` (the learner's
  :class:`~rlstash.ratelimit.RateLimiter`) a batch is handed out only when
  ``wait_insert(frames_per_batch)`` allows it; the actors then wait too.
* Weights: :meth:`update_policy_weights` does one ``ray.put`` per version; every request
  carries that one reference (in a list, so Ray does not fetch it per request) and the
  actor loads it only when the version changed. Batches carry the versions they were
  collected with (:class:`~rlstash.collect.async_.AsyncBatch` attributes).
* Faults (invariant I7): a request that fails (the actor's process was killed, its node
  removed, an env raised, or no reply within ``request_timeout``: then the actor is killed)
  is dropped. Ray restarts a dead actor (``max_restarts``); the next request carries the
  latest weights and a fresh seed, so the actor builds fresh envs. The episodes the actor's
  lanes held end as truncated at the last observation the driver received: the actor's next
  chunk starts with one *bridge* row per lane holding that observation, marked in the batch's
  ``restarted`` field, followed by T - 1 fresh steps; :class:`~rlstash.storage.StreamStorage`
  ends the episodes there and never stitches. Data already handed out are untouched. After
  more than ``max_restarts`` failures of one actor, :class:`RayActorFailedError` names the
  actor, its node and the last exception.
* ``close()`` (also ``with``, garbage collection, interpreter exit) kills the actors (their
  env worker processes exit with them) and, for ``address="local"``, shuts the private Ray
  instance down and removes its temporary directory.

Only gymnasium's next-step autoreset is supported (the default of every rlstash env).
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rlstash.collect.async_ import AsyncBatch, _check_limiter
from rlstash.collect.ray_actor import ChunkActor
from rlstash.collect.ray_session import RaySession, import_ray
from rlstash.collect.sync import EpisodeStats
from rlstash.envs import config

REQUEST_TIMEOUT = 300.0  # seconds a chunk may take before its actor is killed and restarted
RESTART_TIMEOUT = 120.0  # seconds a restarting actor may take to answer again
RETRY_PERIOD = 0.2  # seconds between requests to an actor that Ray is still restarting


@dataclass(frozen=True)
class ActorRestart:
    """One failed request of an actor (its chunk was dropped, its episodes truncated)."""

    actor: int
    lanes: range
    count: int  # failures of this actor so far
    node_ip: str  # where the actor last delivered a chunk ("" if never)
    node_id: str
    pid: int
    error: str  # the exception Ray reported, as text


class RayActorFailedError(RuntimeError):
    """An actor failed more than ``max_restarts`` times; the collector is closed."""

    def __init__(self, event: ActorRestart, max_restarts: int) -> None:
        self.event, self.max_restarts = event, max_restarts
        node = (
            f"node {event.node_ip} (id {event.node_id[:12]})"
            if event.node_ip
            else "a node where it never delivered a chunk"
        )
        super().__init__(
            f"Ray actor {event.actor} (lanes {event.lanes.start}..{event.lanes.stop - 1}, pid "
            f"{event.pid or '?'}) on {node} failed {event.count} time(s), more than "
            f"max_restarts={max_restarts}; the collector is closed. Last exception:\n{event.error}"
        )


@dataclass
class _Actor:
    """The driver's view of one actor."""

    index: int
    handle: Any
    lanes: range
    seed: int | None  # sent with the next request: the actor builds fresh envs
    inflight: Any = None  # ObjectRef of the request in flight
    bridged: bool = False  # the request in flight is asked for T - 1 steps after a bridge row
    sent_at: float = 0.0
    held: deque = field(default_factory=deque)  # complete [T, n] chunks not yet handed out
    next_obs: np.ndarray | None = None  # what its envs showed after the last chunk received
    bridge: np.ndarray | None = None  # last obs of the episodes cut by a failure
    failures: int = 0
    recovering_since: float | None = None  # a failure happened, no chunk since
    retry_at: float = 0.0
    where: dict = field(default_factory=lambda: {"node_ip": "", "node_id": "", "pid": 0})


class RayCollector:
    """Ray actors with env pools and policy copies fill [T, N] batches; see the module docstring."""

    def __init__(
        self,
        env: Any,
        policy_factory: Callable[[], Any],
        num_actors: int,
        envs_per_actor: int,
        frames_per_batch: int,
        seed: int | None = None,
        workers_per_actor: int = 0,
        max_restarts: int = 3,
        rate_limiter: Any = None,
        address: str | None = None,
        actor_options: dict[str, Any] | None = None,
        request_timeout: float = REQUEST_TIMEOUT,
        restart_timeout: float = RESTART_TIMEOUT,
    ) -> None:
        """Start the actors (returns once Ray accepted them; the first batch waits for them).

        Args:
            env: a gymnasium env id or a picklable zero-argument env factory (cloudpickle:
                lambdas are fine); every node needs the env's packages and rlstash.
            policy_factory: zero-argument callable run in each actor (after
                ``torch.manual_seed`` with the actor's seed), returning an ``nn.Module``
                (``actions = policy(obs)``) or an agent (``act(obs)``); obs is a CPU tensor.
            num_actors: K Ray actors.
            envs_per_actor: n envs per actor (N = K * n lanes).
            frames_per_batch: T * N env steps per batch; T >= 2.
            seed: actor a's envs first reset with ``seed + a * n + i``; restart seeds come from
                ``numpy.random.default_rng(seed)``.
            workers_per_actor: env worker processes per actor (0: in the actor's process);
                each actor asks Ray for ``max(1, workers_per_actor)`` CPUs.
            max_restarts: failures tolerated per actor before :class:`RayActorFailedError`.
            rate_limiter: a :class:`~rlstash.ratelimit.RateLimiter`; each batch waits for
                ``wait_insert(frames_per_batch)`` (the caller reports ``on_insert``).
            address: None (use the Ray this process initialized, else start a private one),
                ``"local"`` (a private single-node Ray) or a cluster address ``"host:port"``
                (refused within ``ray_session.CONNECT_TIMEOUT`` s when no Ray answers there:
                :class:`~rlstash.collect.ray_session.RayUnreachableError`).
            actor_options: more options of every actor (``ray.remote(...).options``), e.g.
                ``{"resources": {...}}`` or a ``scheduling_strategy`` (default ``"SPREAD"``);
                ``max_restarts``, ``max_task_retries`` and CUDA hiding are the collector's.
            request_timeout: seconds a chunk may take before its actor is killed (a failure).
            restart_timeout: seconds Ray may take to restart a failed actor before that
                counts as one more failure.
        """
        if isinstance(policy_factory, torch.nn.Module) or not callable(policy_factory):
            raise TypeError(
                f"policy_factory: expected a zero-argument callable returning the policy, "
                f"got {type(policy_factory).__name__} (wrap a module: lambda: MyPolicy(...))"
            )
        K = config.check_positive_int("num_actors", num_actors)
        n = config.check_positive_int("envs_per_actor", envs_per_actor)
        N = K * n
        T = _steps(frames_per_batch, N)
        workers = config.check_positive_int("workers_per_actor", workers_per_actor, minimum=0)
        self.max_restarts = config.check_positive_int("max_restarts", max_restarts, minimum=0)
        self._seed = config.seed(seed)
        _check_limiter(rate_limiter)
        self.num_actors, self.envs_per_actor, self.num_envs = K, n, N
        self.steps_per_batch, self.frames_per_batch = T, T * N
        self.rate_limiter = rate_limiter
        self.request_timeout = _seconds("request_timeout", request_timeout)
        self.restart_timeout = _seconds("restart_timeout", restart_timeout)
        self.frames, self.stats, self.restarts = 0, EpisodeStats(), []
        self._rng = np.random.default_rng(self._seed)
        self._version, self._weights_box = 0, []
        cpus = max(1, workers)
        options = {"num_cpus": cpus, "scheduling_strategy": "SPREAD", **_options(actor_options)}
        self._session = RaySession(address, num_cpus=K * cpus)
        self._actors: list[_Actor] = []
        self._finalizer = weakref.finalize(self, _shutdown, self._actors, self._session)
        ray = import_ray()
        remote = ray.remote(ChunkActor).options(
            **options,
            max_restarts=self.max_restarts,
            max_task_retries=0,  # a chunk in flight when the actor dies is dropped, never redone
            runtime_env={"env_vars": {"CUDA_VISIBLE_DEVICES": ""}},
        )
        for a in range(K):
            first = self._seed + a * n if self._seed is not None else self._fresh_seed()
            handle = remote.remote(env, policy_factory, n, workers)
            self._actors.append(_Actor(a, handle, range(a * n, (a + 1) * n), first))
        for actor in self._actors:
            self._request(actor)

    # --- iteration --------------------------------------------------------------------
    def __iter__(self) -> Iterator[AsyncBatch]:
        while True:
            yield self.collect()

    def collect(self) -> AsyncBatch:
        """The next batch [T, N]: one chunk of every actor (blocks until each has one, and on
        the rate limiter)."""
        self._check_open()
        if self.rate_limiter is not None:
            while not self.rate_limiter.wait_insert(self.frames_per_batch, timeout=0.05):
                self._pump(0)  # receive chunks and notice failures while the learner works
        while not all(a.held for a in self._actors):
            self._pump(1.0)
        return self._assemble()

    def _assemble(self) -> AsyncBatch:
        chunks = [a.held.popleft() for a in self._actors]
        names = list(chunks[0]["data"])
        if any("restarted" in c["data"] for c in chunks) and "restarted" not in names:
            names.append("restarted")
        out = AsyncBatch()
        for name in names:
            parts = [c["data"].get(name) for c in chunks]
            if name == "restarted":
                parts = [p if p is not None else np.zeros((self.steps_per_batch, self.envs_per_actor), bool) for p in parts]  # fmt: skip
            out[name] = torch.from_numpy(np.concatenate(parts, axis=1))  # [T, N, ...], a copy
        n = self.envs_per_actor
        versions = np.array([c["version"] for c in chunks], np.int64)
        out.policy_versions = torch.from_numpy(np.repeat(versions, n))
        out.policy_version = int(versions.min())
        out.worker_index = torch.from_numpy(np.repeat(np.arange(self.num_actors), n))
        out.worker_restarted = torch.from_numpy(np.repeat([c["bridged"] for c in chunks], n))
        for a in self._actors:
            self._request(a)  # actors that waited for room run again
        self.frames += self.frames_per_batch
        return out

    # --- requests and replies ---------------------------------------------------------
    def _request(self, a: _Actor) -> None:
        """Send ``a`` its next request if it has none in flight and room for one more chunk."""
        if a.inflight is not None or len(a.held) >= 1 or time.monotonic() < a.retry_at:
            return
        a.bridged = a.bridge is not None
        steps = self.steps_per_batch - a.bridged
        a.inflight = a.handle.collect.remote(self._weights_box, self._version, steps, a.seed)
        a.sent_at = time.monotonic()

    def _pump(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the first reply, take every ready one, resend."""
        ray = import_ray()
        for a in self._actors:
            self._request(a)  # a retry that came due
        by_ref = {a.inflight: a for a in self._actors if a.inflight is not None}
        if not by_ref:
            time.sleep(min(timeout, RETRY_PERIOD))
            return
        ready, _ = ray.wait(list(by_ref), num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(list(by_ref), num_returns=len(by_ref), timeout=0)
        for ref in ready:
            a = by_ref[ref]
            a.inflight = None
            try:
                reply = ray.get(ref)
            except ray.exceptions.RayError as exc:
                self._failed(a, exc)
            else:
                self._received(a, reply)
            self._request(a)
        now = time.monotonic()
        for a in self._actors:
            if a.inflight is not None and now - a.sent_at > self.request_timeout:
                ray.kill(a.handle, no_restart=False)  # its reply becomes the failure
                a.sent_at = now  # not again before Ray reported it

    def _received(self, a: _Actor, reply: dict) -> None:
        data = reply["data"]
        if a.bridged:
            data = _with_bridge(a.bridge, data, self.steps_per_batch)
        a.held.append({"data": data, "version": reply["version"], "bridged": a.bridged})
        a.next_obs = np.array(reply["next_obs"])  # a copy: the reply's object can be freed
        a.seed, a.bridge, a.bridged, a.recovering_since = None, None, False, None
        a.where = {k: reply[k] for k in ("node_ip", "node_id", "pid")}
        self.stats.returns.extend(reply["returns"])
        self.stats.lengths.extend(reply["lengths"])
        self.stats.count += len(reply["returns"])

    def _failed(self, a: _Actor, exc: Exception) -> None:
        """Count a failure (or wait for Ray to finish restarting the actor); plan the cut."""
        ray = import_ray()
        now = time.monotonic()
        restarting = isinstance(exc, ray.exceptions.ActorUnavailableError)
        if a.recovering_since is not None and restarting:
            if now - a.recovering_since < self.restart_timeout:
                a.retry_at = now + RETRY_PERIOD  # Ray is still restarting it: ask again soon
                return
            exc = TimeoutError(
                f"the actor did not come back within restart_timeout={self.restart_timeout:g} s: "
                f"{exc}"
            )
        a.failures += 1
        event = ActorRestart(a.index, a.lanes, a.failures, error=str(exc), **a.where)
        self.restarts.append(event)
        if a.failures > self.max_restarts:
            self.close()
            raise RayActorFailedError(event, self.max_restarts)
        a.recovering_since, a.retry_at = now, now
        a.seed = self._fresh_seed()
        if a.bridge is None and a.next_obs is not None:
            a.bridge = a.next_obs  # the cut episodes' last observation
        a.bridged = False

    # --- weights ----------------------------------------------------------------------
    def update_policy_weights(self, state_dict: Any) -> int:
        """Publish ``state_dict`` (the policy's ``policy_state_dict()`` / ``state_dict()``,
        CPU tensors) with one ``ray.put``; returns the new version, which the chunks collected
        with it carry. The previous version's object is released."""
        self._check_open()
        if not isinstance(state_dict, dict):
            raise TypeError(
                f"state_dict: expected a dict of tensors, got {type(state_dict).__name__}"
            )
        ray = import_ray()
        self._weights_box = [ray.put(_to_cpu(state_dict))]
        self._version += 1
        return self._version

    @property
    def policy_version(self) -> int:
        """The newest published version (0: the factory's own weights)."""
        return self._version

    # --- introspection ----------------------------------------------------------------
    def envs_of(self, actor: int) -> range:
        """The batch lanes of ``actor``."""
        return self._actors[actor].lanes

    def actor_info(self, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Per actor (once it has delivered): ``pid``, ``node_ip``, ``node_id``,
        ``cuda_visible_devices``, ``cuda_available``, ``cuda_initialized``, ``version``,
        ``worker_pids`` (its env worker processes)."""
        ray = import_ray()
        self._check_open()
        return ray.get([a.handle.info.remote() for a in self._actors], timeout=timeout)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Kill the actors and, for a private Ray instance, shut it down (idempotent)."""
        self._finalizer()

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("RayCollector is closed")

    def _fresh_seed(self) -> int:
        return int(self._rng.integers(2**31 - 1))

    def __enter__(self) -> RayCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"RayCollector(num_actors={self.num_actors}, envs_per_actor={self.envs_per_actor}, "
            f"frames_per_batch={self.frames_per_batch})"
        )


def _with_bridge(bridge: np.ndarray, data: dict, T: int) -> dict[str, np.ndarray]:
    """A [T, n] chunk: row 0 holds the cut episodes' last obs (``restarted``: that step never
    happened), rows 1.. the fresh envs' T - 1 steps (``data``)."""
    n = len(bridge)
    first = {
        "obs": bridge[None],
        "reward": np.zeros((1, n), np.float32),
        "terminated": np.zeros((1, n), bool),
        "truncated": np.zeros((1, n), bool),
    }
    first["action"] = np.zeros_like(data["action"][:1])
    out = {k: np.concatenate([first[k], v]) for k, v in data.items() if k in first}
    restarted = np.zeros((T, n), bool)
    restarted[0] = True
    if "restarted" in data:  # a worker of the actor's pool restarted too
        restarted[1:] |= data["restarted"]
    out["restarted"] = restarted
    return out


def _options(given: Any) -> dict[str, Any]:
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise TypeError(f"actor_options: expected a dict of Ray actor options, got {given!r}")
    ours = sorted(set(given) & {"max_restarts", "max_task_retries", "runtime_env"})
    if ours:
        raise ValueError(
            f"actor_options: {', '.join(ours)} are set by the collector (max_restarts is its "
            "own argument; CUDA is hidden through runtime_env); drop them"
        )
    return dict(given)


def _to_cpu(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.detach().cpu()
    if isinstance(state, dict):
        return {k: _to_cpu(v) for k, v in state.items()}
    return state


def _steps(frames_per_batch: Any, n: int) -> int:
    if isinstance(frames_per_batch, bool) or not isinstance(frames_per_batch, int):
        raise TypeError(f"frames_per_batch: expected an int, got {frames_per_batch!r}")
    if frames_per_batch < 2 * n or frames_per_batch % n:
        lo = max(2 * n, frames_per_batch // n * n)
        raise ValueError(
            f"frames_per_batch: expected a multiple of num_envs ({n} = num_actors x "
            f"envs_per_actor) of at least 2 steps per env, got {frames_per_batch}; use {lo} or {lo + n}"
        )
    return frames_per_batch // n


def _seconds(name: str, value: Any) -> float:
    """A timeout in seconds > 0 (finite); ValueError naming ``name`` otherwise."""
    seconds = config.step_timeout(value, name)
    if seconds is None:
        raise ValueError(f"{name}: expected seconds > 0, got None")
    return seconds


def _shutdown(actors: list[_Actor], session: RaySession) -> None:
    """Kill every actor (no restart), then close the session (finalizer: no reference to self)."""
    try:
        import ray

        if ray.is_initialized():
            for a in actors:
                try:
                    ray.kill(a.handle, no_restart=True)
                except Exception:  # noqa: BLE001 - already dead or Ray gone: nothing to stop
                    pass
    finally:
        actors.clear()
        session.close()
