"""RayCollector on a simulated multi-node cluster (``ray.cluster_utils.Cluster``).

Run only inside a loopback-only network namespace (``python3 run.py test`` does that with
``unshare -n``); one cluster (head + one worker node) serves every test of the run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time

import numpy as np
import pytest
import torch

from rlstash.storage.stream import ReadSpec, StreamStorage
from tests.collect.ray_net import only_loopback
from tests.envs.helpers import wait_gone

pytestmark = [pytest.mark.ray, pytest.mark.multiproc, only_loopback]

MiB = 1024**2


class Constant(torch.nn.Module):
    """CartPole policy whose action is the sign of a bias: the weights decide every action."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.tensor([0.0]))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (self.bias > 0).long().expand(len(obs))


def weights(action: int) -> dict[str, torch.Tensor]:
    return {"bias": torch.tensor([1.0 if action else -1.0])}


@pytest.fixture(scope="session")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    tmp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths live below it
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = tmp  # every node's session, logs, sockets and address file
    args = {"num_cpus": 1, "object_store_memory": 80 * MiB}
    try:
        c = Cluster(initialize_head=True, head_node_args={**args, "include_dashboard": False})
        try:
            c.add_node(num_cpus=2, object_store_memory=80 * MiB)
            c.wait_for_nodes()
            c.connect()
            yield c
        finally:
            ray.shutdown()
            c.shutdown()
    finally:
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(tmp, ignore_errors=True)  # sessions, logs, sockets: nothing left in /tmp


def make(cluster, **kw):
    from rlstash.collect.ray import RayCollector

    args = dict(
        env="CartPole-v1", policy_factory=Constant, num_actors=2, envs_per_actor=2,
        frames_per_batch=2 * 2 * 8, seed=0,
    )  # fmt: skip
    args.update(kw)
    return RayCollector(**args)


def test_collects_across_nodes_and_survives_kill_9_of_an_actor(cluster):
    c = make(cluster, workers_per_actor=1)
    store = StreamStorage(
        {"obs": ((4,), torch.float32), "action": ((), torch.int64)}, c.num_envs, 4 * 256,
        reads=ReadSpec(n_step=1, gamma=0.99, frame_stack=2),
    )  # fmt: skip
    try:
        first = c.collect()
        store.extend(first)
        info = c.actor_info()
        assert len({i["node_id"] for i in info}) == 2, "the actors did not spread over both nodes"
        for i in info:  # I1: the policy copy sees no GPU; one env worker process per actor
            assert i["cuda_visible_devices"] == "" and not i["cuda_initialized"]
            assert len(i["worker_pids"]) == 1
        assert first["obs"].shape == (8, 4, 4) and first.policy_version == 0
        assert c.update_policy_weights(weights(1)) == 1
        for _ in range(3):
            batch = c.collect()
            store.extend(batch)
        assert (batch.policy_versions == 1).all() and (batch["action"] == 1).all()
        assert c.update_policy_weights(weights(0)) == 2
        victim, lanes = info[0], c.envs_of(0)
        os.kill(victim["pid"], signal.SIGKILL)  # its request in flight is lost with it
        cut = None
        for _ in range(6):
            batch = c.collect()
            store.extend(batch)
            if bool(batch.worker_restarted.any()):
                cut = batch
                break
        assert cut is not None, "no batch reported the restarted actor"
        assert cut.worker_restarted.tolist() == [True, True, False, False]
        assert cut["restarted"][0, lanes].all() and not cut["restarted"][1:].any()
        assert (cut.policy_versions[lanes] == 2).all()  # the latest weights, loaded on restart
        assert (cut["action"][1:, lanes] == 0).all()
        assert len(c.restarts) == 1 and c.restarts[0].actor == 0
        assert c.restarts[0].node_id == victim["node_id"]
        fresh = cut["obs"][1, lanes]  # the restarted envs' first observation: a fresh seed
        assert not torch.equal(fresh, first["obs"][0, lanes])
        assert (fresh.abs() <= 0.05).all()  # CartPole's reset range: a new episode
        # I7: the cut episodes end as truncated at the last obs received, never stitched
        got = store.read(np.flatnonzero(store.valid))
        bridge = cut["obs"][0, lanes]
        ends = [
            i for i in range(len(got["obs"]))
            if any(torch.equal(got["next_obs"][i, -1], b) for b in bridge)
        ]  # fmt: skip
        for i in ends:
            assert got["truncated"][i] or got["terminated"][i]
        assert not any(
            torch.equal(got["obs"][i, -1], b) for i in range(len(got["obs"])) for b in bridge
        )
        starts = [i for i in range(len(got["obs"])) if torch.equal(got["obs"][i, -1], fresh[0])]
        assert starts and torch.equal(got["obs"][starts[0], 0], fresh[0])  # clean frame stack
        after = c.actor_info()
        assert after[0]["pid"] != victim["pid"] and after[0]["version"] == 2
        old_workers = victim["worker_pids"]
        assert not wait_gone(old_workers, 10)  # the dead actor's env worker exited with it
        pids = [p for i in after for p in [i["pid"], *i["worker_pids"]]]
    finally:
        c.close()
        store.close()
    assert not wait_gone(pids, 10)  # close() leaves no actor or env worker process
    with pytest.raises(RuntimeError, match="closed"):
        c.collect()


def test_removed_node_run_goes_on_with_the_rest(cluster):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = cluster.add_node(num_cpus=2, object_store_memory=80 * MiB)
    cluster.wait_for_nodes()
    there = NodeAffinitySchedulingStrategy(node.node_id, soft=True)  # else anywhere
    c = make(cluster, actor_options={"scheduling_strategy": there})
    try:
        c.collect()
        victims = c.actor_info()
        assert {i["node_id"] for i in victims} == {node.node_id}
        cluster.remove_node(node, allow_graceful=False)  # the machine is gone, and with it
        for pid in [i["pid"] for i in victims]:  # its processes (an actor can outlive its
            with contextlib.suppress(ProcessLookupError):  # raylet for a while under load)
                os.kill(pid, signal.SIGKILL)
        for _ in range(4):
            batch = c.collect()
        assert len(c.restarts) == 2 and {e.node_id for e in c.restarts} == {node.node_id}
        assert node.node_id not in {i["node_id"] for i in c.actor_info()}
        assert batch["obs"].shape == (8, 4, 4)
    finally:
        c.close()


def test_too_many_failures_name_the_actor_node_and_exception(cluster):
    from rlstash.collect.ray import RayActorFailedError

    c = make(cluster, num_actors=1, max_restarts=0)
    try:
        c.collect()
        pid = c.actor_info()[0]["pid"]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(RayActorFailedError) as err:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                c.collect()
        text = str(err.value)
        assert "Ray actor 0" in text and "127.0.0.1" in text and "max_restarts=0" in text
        assert "Last exception" in text and err.value.event.pid == pid
        assert c.closed
    finally:
        c.close()


def test_rate_limiter_holds_collection_back_until_the_learner_samples(cluster):
    import threading

    from rlstash.ratelimit import RateLimiter

    limiter = RateLimiter(min_size=32, samples_per_insert=1.0, batch_size=32, tolerance=32)
    c = make(cluster, rate_limiter=limiter)
    try:
        for _ in range(2):  # 64 rows: 32 more than samples_per_insert * min_size + tolerance
            limiter.on_insert(len(c.collect()["reward"]) * c.num_envs)
        assert not limiter.can_insert(32)
        threading.Timer(1.5, limiter.on_sample, args=(32,)).start()  # the learner catches up
        t0 = time.monotonic()
        c.collect()
        assert time.monotonic() - t0 >= 1.4
        with pytest.raises(TypeError, match="state_dict"):
            c.update_policy_weights([1, 2])
    finally:
        c.close()


def test_raising_env_and_policy_are_contained(cluster):
    c = make(cluster, env=_Flaky, policy_factory=_FlakyPolicy, num_actors=1, envs_per_actor=1,
             frames_per_batch=4)  # fmt: skip
    try:
        batches = [c.collect() for _ in range(5)]
        # the env's exception: its pool restarted the env (a pool-level cut, same field)
        assert any("restarted" in b and not bool(b.worker_restarted.any()) for b in batches)
        # the policy's exception failed the request: the actor rebuilt its envs (fresh seed)
        assert len(c.restarts) == 1 and "flaky policy" in c.restarts[0].error
        assert sum(bool(b.worker_restarted.all()) for b in batches) == 1
    finally:
        c.close()


class _FlakyPolicy(Constant):
    """Raises on its 6th call (a bug in the policy: the actor's request fails)."""

    calls = 0

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        if type(self).calls == 6:
            raise RuntimeError("flaky policy")
        return super().forward(obs)


def _Flaky():
    """CartPole whose 7th step in this process raises (once per process)."""
    import gymnasium as gym

    class Flaky(gym.Wrapper):
        steps = 0

        def step(self, action):
            type(self).steps += 1
            if type(self).steps == 7:
                raise RuntimeError("flaky env")
            return self.env.step(action)

    return Flaky(gym.make("CartPole-v1"))
