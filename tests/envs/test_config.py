"""Argument checks (before any process starts), default worker count, CPU quota."""

from __future__ import annotations

import os

import psutil
import pytest

from rlstash.envs import OversubscriptionWarning, ProcessPoolVectorEnv, usable_cpus
from rlstash.envs.cpus import _cgroup_quota
from rlstash.envs.testing import CountEnv


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"env_fns": 3, "num_envs": 2}, TypeError, r"env_fns: expected a gymnasium env id"),
        ({"env_fns": [], "num_envs": 2}, TypeError, r"env_fns: expected"),
        ({"env_fns": "CartPole-v1", "num_envs": None}, ValueError, r"num_envs: required"),
        ({"env_fns": [CountEnv] * 3, "num_envs": 4}, ValueError, r"num_envs: 4 given with 3"),
        ({"num_envs": 0}, ValueError, r"num_envs: expected an int >= 1, got 0"),
        ({"num_envs": 2.0}, TypeError, r"num_envs: expected an int"),
        ({"num_workers": -1}, ValueError, r"num_workers: expected an int >= 0, got -1"),
        ({"num_workers": "many"}, ValueError, r"num_workers: expected an int >= 0, None or 'auto'"),
        ({"context": "thread"}, ValueError, r"context: expected one of"),
        ({"step_timeout": 0}, ValueError, r"step_timeout: expected seconds > 0"),
        ({"max_restarts": -1}, ValueError, r"max_restarts: expected an int >= 0"),
        ({"autoreset_mode": "sometimes"}, ValueError, r"autoreset_mode: expected one of"),
        ({"env_kwargs": [1]}, TypeError, r"env_kwargs: expected a dict"),
        ({"seed": -3}, ValueError, r"seed: expected an int >= 0, got -3"),
        ({"worker_env": {1: "x"}}, TypeError, r"worker_env: expected a dict of str"),
    ],
)
def test_bad_arguments_raise_before_any_process(kwargs, error, match):
    args = {"env_fns": CountEnv, "num_envs": 2, "num_workers": 1, **kwargs}
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(error, match=match):
        ProcessPoolVectorEnv(**args)
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after <= before


def test_default_workers_is_usable_cores_capped_by_envs():
    """Every env in a worker (caller_envs=0): the usable cores, at most one per env; the
    default layout (no layout argument) is tests/envs/test_layout_default.py's."""
    with ProcessPoolVectorEnv(CountEnv, num_envs=1) as pool:
        assert pool.num_workers == 1
    with ProcessPoolVectorEnv(CountEnv, num_envs=8, caller_envs=0) as pool:
        assert pool.num_workers == min(usable_cpus(), 8)
        assert pool.start_method == "forkserver"


def test_far_more_workers_than_cores_warns_once_with_numbers():
    cores = usable_cpus()
    n = 2 * cores + 1
    with pytest.warns(OversubscriptionWarning) as record:
        pool = ProcessPoolVectorEnv(CountEnv, num_envs=n, num_workers=n)
    pool.close()
    assert len(record) == 1
    assert f"num_workers={n} worker processes for {cores} usable CPU core(s)" in str(
        record[0].message
    )


def test_usable_cpus_respects_affinity():
    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))


def _fake_cgroup(tmp_path, lines, files):
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "cgroup"
    proc.write_text("\n".join(lines) + "\n")
    root = tmp_path / "fs"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root, proc


def test_cgroup_v2_quota_tightest_along_the_path(tmp_path):
    root, proc = _fake_cgroup(
        tmp_path,
        ["0::/a/b"],
        {"a/cpu.max": "150000 100000\n", "a/b/cpu.max": "max 100000\n", "cpu.max": "max 100000"},
    )
    assert _cgroup_quota(root, proc) == pytest.approx(1.5)


def test_cgroup_v1_quota_and_unlimited(tmp_path):
    root, proc = _fake_cgroup(
        tmp_path,
        ["4:cpu,cpuacct:/job", "3:memory:/job"],
        {
            "cpu,cpuacct/job/cpu.cfs_quota_us": "250000",
            "cpu,cpuacct/job/cpu.cfs_period_us": "100000",
        },
    )
    assert _cgroup_quota(root, proc) == pytest.approx(2.5)
    root, proc = _fake_cgroup(tmp_path / "x", ["0::/"], {"cpu.max": "max 100000"})
    assert _cgroup_quota(root, proc) is None
