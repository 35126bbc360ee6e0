"""AsyncCollector: layout, policy copies in workers, weight updates, faults, no leaks."""

from __future__ import annotations

import functools
import gc
import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest
import torch
from torch import nn

from rlstash.agents.dqn import DQN, DQNConfig
from rlstash.collect.async_ import AsyncBatch, AsyncCollector
from rlstash.envs.errors import WorkerFailedError, WorkerRestartWarning
from rlstash.envs.testing import CountEnv, CrashEnv, HangEnv
from rlstash.ratelimit import RateLimiter
from rlstash.storage.stream import StreamStorage
from tests.envs.helpers import (
    interrupt,
    kill_tree,
    marked_processes,
    shm_files,
    start_script,
    wait_for_line,
    wait_gone,
)

pytestmark = pytest.mark.multiproc
FIELDS = {"obs", "action", "reward", "terminated", "truncated"}


class FixedPolicy(nn.Module):
    """A tiny MLP whose output is its bias: ``argmax(0 * obs + bias)`` = ``action``."""

    def __init__(self, action: int = 1, n_obs: int = 4, n_actions: int = 2, dtype=torch.float32):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(n_obs, 8), nn.Tanh(), nn.Linear(8, n_actions))
        self.body.to(dtype)
        with torch.no_grad():
            self.body[2].weight.zero_()
            self.body[2].bias.zero_()
            self.body[2].bias[action] = 1.0

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.body(obs).argmax(-1)  # [n] int64


def fixed(action: int, **kw):
    return functools.partial(FixedPolicy, action, **kw)


COUNT = functools.partial(CountEnv, episode_len=50)  # obs [seed, t] float64, Discrete(3)
LONG = functools.partial(CountEnv, episode_len=1000)  # no episode ends during a test
COUNT_POLICY = fixed(0, n_obs=2, n_actions=3, dtype=torch.float64)


@pytest.fixture
def make():
    """Build collectors; close them and check that no worker outlives the test."""
    made: list[AsyncCollector] = []

    def build(*args, **kwargs) -> AsyncCollector:
        c = AsyncCollector(*args, **kwargs)
        made.append(c)
        return c

    yield build
    for c in made:
        c.close()
    assert wait_gone([p.pid for p in marked_processes(os.getpid())]) == []


def _check_stream(batches: list[AsyncBatch], n: int, same_step: bool = False) -> int:
    """Feed CountEnv batches to a StreamStorage; every stored transition must be one real
    env step (same seed, t -> t + 1): nothing stitched. Returns the transitions checked."""
    spec = {"obs": ((2,), torch.float64), "action": ((), torch.int64)}
    mode = "same_step" if same_step else "next_step"
    st = StreamStorage(spec, num_envs=n, capacity=n * 1000, autoreset=mode)
    for b in batches:
        st.extend(dict(b))
    idx = np.flatnonzero(st.valid)
    out = st.read(idx)
    obs, nxt = out["obs"].numpy(), out["next_obs"].numpy()
    np.testing.assert_array_equal(nxt[:, 0], obs[:, 0])  # same episode seed
    np.testing.assert_array_equal(nxt[:, 1], obs[:, 1] + 1)  # one step later
    return idx.size


def test_layout_actions_and_worker_environment(make):
    c = make("CartPole-v1", fixed(1), num_workers=2, frames_per_batch=64, envs_per_worker=2, seed=0)
    assert (c.num_envs, c.steps_per_batch) == (4, 16)
    batches = [c.collect() for _ in range(3)]
    b = batches[0]
    assert isinstance(b, AsyncBatch) and set(b) == FIELDS
    assert b["obs"].shape == (16, 4, 4) and b["obs"].dtype == torch.float32
    assert b["action"].shape == (16, 4) and b["action"].dtype == torch.int64
    assert b["reward"].dtype == torch.float32
    assert b["terminated"].dtype == b["truncated"].dtype == torch.bool
    assert b.policy_version == 0 and b.policy_versions.tolist() == [0] * 4
    assert b.worker_index.tolist() == [0, 0, 1, 1] and not b.worker_restarted.any()
    for b in batches:
        assert torch.all(b["action"] == 1)  # chosen by the workers' own policy copies
    obs = torch.cat([b["obs"] for b in batches])  # [48, 4, 4]: lanes continue batch to batch
    done = torch.cat([b["terminated"] | b["truncated"] for b in batches])
    reward = torch.cat([b["reward"] for b in batches])
    t, i = map(int, torch.nonzero(done)[0])
    assert reward[t + 1, i] == 0 and not done[t + 1, i]  # next-step: a reset step follows
    reset_row = torch.cat([torch.zeros_like(done[:1]), done[:-1]])  # the row after a done
    step = ~done[:-1] & ~reset_row[:-1]  # rows t whose row t + 1 is the same episode
    moved = (obs[1:] - obs[:-1]).abs().amax(-1)[step]  # CartPole moves a little per step
    assert float(moved.max()) < 1.0
    assert c.stats.count > 0 and c.frames == 192
    for info in c.worker_info():
        assert info["boot"] == {"cuda_visible_devices": "", "torch_imported_before_boot": False}
        assert info["cuda_available"] is False and info["cuda_initialized"] is False
        assert info["num_threads"] == 1 and info["pid"] in c.worker_pids


def test_weight_update_reaches_workers(make):
    c = make("CartPole-v1", fixed(1), num_workers=2, frames_per_batch=32, envs_per_worker=2)
    c.collect()
    with pytest.raises(ValueError, match=r"body\.0\.weight.*\[8, 4\]"):
        c.update_policy_weights({**FixedPolicy(0).state_dict(), "body.0.weight": torch.zeros(8)})
    with pytest.raises(ValueError, match="missing"):
        c.update_policy_weights({"body.0.weight": torch.zeros(8, 4)})
    with pytest.raises(TypeError, match="state_dict"):
        c.update_policy_weights([1, 2])
    assert c.policy_version == 0  # nothing written
    assert c.update_policy_weights(FixedPolicy(0).state_dict()) == 1
    seen = []
    for _ in range(12):
        b = c.collect()
        for v, lane_actions in zip(b.policy_versions.tolist(), b["action"].T):
            assert torch.all(lane_actions == (0 if v == 1 else 1)), (v, lane_actions)
        seen.append(b.policy_version)
        if b.policy_version == 1:
            break
    assert seen[-1] == 1 and seen == sorted(seen)
    assert all(info["policy_version"] == 1 for info in c.worker_info())


def test_agent_policy_and_its_nested_state_dict(make):
    """Agents act through ``act(obs)`` and ship ``policy_state_dict()`` (nested nets plus
    non-tensor values such as ``algo`` and ``env_steps``)."""
    factory = functools.partial(DQN, (4,), 2, DQNConfig(net_arch=(8,), seed=0))
    c = make("CartPole-v1", factory, num_workers=1, frames_per_batch=8, envs_per_worker=2)
    learner = factory()
    learner.env_steps = 1234
    assert c.update_policy_weights(learner.policy_state_dict()) == 1
    bad = learner.policy_state_dict()
    bad["nets"]["q"] = {k: v[..., :1] for k, v in bad["nets"]["q"].items()}
    with pytest.raises(ValueError, match=r"nets/q/.*expected a tensor of shape"):
        c.update_policy_weights(bad)
    for _ in range(8):
        b = c.collect()
        assert set(b["action"].unique().tolist()) <= {0, 1}
        if b.policy_version == 1:
            break
    assert b.policy_version == 1 and c.restarts == []


def test_kill_9_restarts_truncates_and_never_stitches(make):
    c = make(LONG, COUNT_POLICY, num_workers=2, frames_per_batch=40, envs_per_worker=2, seed=3)
    batches = [c.collect() for _ in range(2)]
    old = c.worker_pids
    time.sleep(0.05)  # worker 0 is filling a slot now
    os.kill(old[0], signal.SIGKILL)
    with pytest.warns(WorkerRestartWarning, match="worker 0"):
        batches += [c.collect() for _ in range(6)]
    assert c.worker_pids[0] != old[0] and c.worker_pids[1] == old[1]
    (event,) = c.restarts
    assert (event.worker, event.envs, event.reason) == (0, (0, 1), "died")
    assert "SIGKILL" in event.error
    cut = [k for k, b in enumerate(batches) if b.worker_restarted.any()]
    assert len(cut) == 1 and batches[cut[0]].worker_restarted.tolist() == [1, 1, 0, 0]
    last, nxt = batches[cut[0]], batches[cut[0] + 1]
    assert torch.all(last["terminated"][-1, :2] | last["truncated"][-1, :2])  # episodes ended
    assert torch.all(nxt["reward"][0, :2] == 0)  # a reset step whose obs is the final obs
    assert torch.equal(nxt["obs"][0, :2, 1], last["obs"][-1, :2, 1] + 1)
    assert len(set(nxt["obs"][1, :2, 0].tolist()) & set(last["obs"][-1, :2, 0].tolist())) == 0
    assert _check_stream(batches, 4) > 8 * 10 * 4 - 20


def test_same_step_mode_after_a_crash(make, tmp_path):
    crash = functools.partial(CrashEnv, crash_at=25, once_file=str(tmp_path / "once"))
    c = make([COUNT, crash], COUNT_POLICY, num_workers=2, frames_per_batch=20,
             autoreset_mode="same_step", seed=1)  # fmt: skip
    with pytest.warns(WorkerRestartWarning, match="planned crash"):
        batches = [c.collect() for _ in range(6)]
    assert set(batches[0]) == FIELDS | {"final_obs"}
    assert [e.reason for e in c.restarts] == ["exception"]
    assert _check_stream(batches, 2, same_step=True) > 100


def test_hang_is_restarted_after_step_timeout(make, tmp_path):
    hang = functools.partial(HangEnv, hang_at=12, once_file=str(tmp_path / "once"))
    c = make(hang, COUNT_POLICY, num_workers=1, frames_per_batch=5, step_timeout=0.3)
    with pytest.warns(WorkerRestartWarning, match="timeout"):
        batches = [c.collect() for _ in range(5)]
    assert [e.reason for e in c.restarts] == ["timeout"]
    assert _check_stream(batches, 1) >= 15


def test_failing_worker_gives_worker_failed_error(make):
    crash = functools.partial(CrashEnv, crash_at=2)
    c = make(crash, COUNT_POLICY, num_workers=1, frames_per_batch=4, max_restarts=1)
    with pytest.warns(WorkerRestartWarning), pytest.raises(WorkerFailedError) as info:
        for _ in range(10):
            c.collect()
    err = info.value
    assert (err.worker, err.envs, err.failures) == (0, (0,), 2)
    assert "env worker 0" in str(err) and "planned crash at step 2" in str(err)
    assert c.closed and wait_gone(c.worker_pids) == []
    with pytest.raises(RuntimeError, match="closed"):
        c.collect()


def test_worker_that_cannot_start_names_itself():
    bad = functools.partial(CrashEnv, mode="melt")  # raises ValueError in the worker
    before = marked_processes(os.getpid())
    with pytest.raises(WorkerFailedError, match=r"env worker 1 \(envs 1\) could not start"):
        AsyncCollector([LONG, bad], COUNT_POLICY, num_workers=2, frames_per_batch=2)
    assert wait_gone([p.pid for p in marked_processes(os.getpid())]) == []
    assert len(marked_processes(os.getpid())) == len(before)


def test_rate_limiter_blocks_until_the_learner_samples(make):
    limiter = RateLimiter(min_size=1, samples_per_insert=1.0, batch_size=1, insert_chunk=16)
    c = make(COUNT, COUNT_POLICY, num_workers=1, frames_per_batch=16, rate_limiter=limiter)
    c.collect()
    limiter.on_insert(16)  # diff = 16: another insert needs diff <= 1, i.e. 15 rows sampled
    got: list[AsyncBatch] = []
    thread = threading.Thread(target=lambda: got.append(c.collect()))
    thread.start()
    try:
        time.sleep(0.5)
        assert not got  # blocked in wait_insert although the worker has chunks ready
        limiter.on_sample(15)
        thread.join(10)
        assert len(got) == 1 and got[0]["obs"].shape == (16, 1, 2)
    finally:
        limiter.on_sample(1000)
        thread.join(10)


def test_bad_arguments_start_nothing():
    before = marked_processes(os.getpid())
    cases = [
        (dict(frames_per_batch=30), ValueError, "frames_per_batch.*multiple of num_envs \\(4"),
        (dict(frames_per_batch=2.5), TypeError, "frames_per_batch"),
        (dict(num_workers=0), ValueError, "num_workers"),
        (dict(slots_per_worker=1), ValueError, "slots_per_worker"),
        (dict(start_method="fork"), ValueError, "start_method"),
        (dict(autoreset_mode="disabled"), ValueError, "autoreset_mode"),
        (dict(policy_factory=FixedPolicy()), TypeError, "policy_factory"),
        (dict(rate_limiter=object()), TypeError, "rate_limiter"),
        (dict(env_fns=[COUNT] * 3), ValueError, "3 factories"),
        (dict(step_timeout=0), ValueError, "step_timeout"),
    ]
    for override, exc, match in cases:
        kwargs = dict(env_fns=COUNT, policy_factory=COUNT_POLICY, num_workers=2,
                      frames_per_batch=32, envs_per_worker=2)  # fmt: skip
        kwargs.update(override)
        with pytest.raises(exc, match=match):
            AsyncCollector(**kwargs)
    assert marked_processes(os.getpid()) == before


def test_garbage_collection_and_with_stop_workers():
    with AsyncCollector(COUNT, COUNT_POLICY, num_workers=1, frames_per_batch=4) as c:
        c.collect()
        pids = c.worker_pids + [p.pid for p in marked_processes(os.getpid())]
    assert c.closed and wait_gone(pids) == []
    c = AsyncCollector(COUNT, COUNT_POLICY, num_workers=1, frames_per_batch=4, start_method="spawn")
    c.collect()
    pids = [p.pid for p in marked_processes(os.getpid())]
    del c
    gc.collect()
    assert wait_gone(pids) == [] and marked_processes(os.getpid()) == []


SCRIPT = """
import sys, torch
from rlstash.collect.async_ import AsyncCollector

class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)
    def forward(self, obs):
        return self.lin(obs).argmax(-1)

workers = int(sys.argv[2])
c = AsyncCollector("CartPole-v1", Policy, num_workers=workers, frames_per_batch=16 * workers,
                   envs_per_worker=2, seed=0, start_method=sys.argv[1])
batches = iter(c)
for _ in range(3):
    next(batches)
c.update_policy_weights(Policy().state_dict())
print("PIDS", " ".join(map(str, c.worker_pids)), flush=True)
sys.stdin.readline()
while True:
    next(batches)
"""
BAD_WORDS = ("leaked", "resource_tracker", "ResourceWarning", "Exception ignored")


def _shm_used_by(pids: list[int]) -> set[str]:
    """Names of /dev/shm files mapped or open in these processes."""
    used = set()
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            paths = [m.path for m in proc.memory_maps()] + [f.path for f in proc.open_files()]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        used |= {os.path.basename(x) for x in paths if x.startswith("/dev/shm/")}
    return used


def _leaked_shm(before: set[str]) -> set[str]:
    """New /dev/shm files that no live process holds (/dev/shm is shared with the other
    programs of this machine: their files come and go while the test runs)."""
    new = shm_files() - before
    return new - _shm_used_by([p.pid for p in psutil.process_iter()]) if new else set()


@pytest.mark.parametrize("method, workers", [("forkserver", 2), ("spawn", 1)])
def test_ctrl_c_leaves_no_process_shm_file_or_warning(method, workers):
    before = shm_files()
    proc = start_script(SCRIPT, method, str(workers))
    try:
        pids = [int(p) for p in wait_for_line(proc, "PIDS", timeout=60).split()[1:]]
        workers = [p.pid for p in marked_processes(proc.pid)]
        assert set(pids) <= set(workers)
        assert _shm_used_by([proc.pid, *workers]) == set()  # anonymous memfd segments only
        proc.stdin.write("go\n")
        proc.stdin.flush()
        stderr = interrupt(proc, 0.3)  # while it collects
    finally:
        kill_tree(proc)
    assert "KeyboardInterrupt" in stderr
    assert wait_gone(workers) == [] and marked_processes(proc.pid) == []
    assert _leaked_shm(before) == set()
    for word in BAD_WORDS:
        assert word not in stderr, stderr
