"""Workers are torch-free, CUDA-blind, single-threaded math, deaf to Ctrl-C (invariant I1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from rlstash.envs import ProcessPoolVectorEnv
from rlstash.envs.testing import CountEnv
from tests.envs.helpers import ROOT, kill_tree, start_script, wait_for_line

pytestmark = pytest.mark.multiproc


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_workers_have_no_torch_hidden_cuda_and_one_thread(method):
    assert "torch" in sys.modules  # the test process has torch (conftest), workers must not
    with ProcessPoolVectorEnv(CountEnv, 4, num_workers=2, context=method) as pool:
        infos = pool.worker_info()
        assert [i["pid"] for i in infos] == pool.worker_pids
        for info in infos:
            assert not [m for m in info["modules"] if m == "torch" or m.startswith("torch.")]
            assert info["environ"] == {
                "CUDA_VISIBLE_DEVICES": "",
                "OMP_NUM_THREADS": "1",
                "OPENBLAS_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
            }


def test_worker_env_overrides():
    with ProcessPoolVectorEnv(
        CountEnv, 2, num_workers=1, worker_env={"OMP_NUM_THREADS": "3"}
    ) as pool:
        assert pool.worker_info()[0]["environ"]["OMP_NUM_THREADS"] == "3"


def test_worker_modules_import_without_torch_in_a_fresh_interpreter():
    code = (
        "import sys, rlstash.envs.worker, rlstash.envs.forkserver, rlstash.envs, "
        "rlstash.envs.testing; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_script_that_imports_torch_first_still_gets_torch_free_workers():
    """The real-world case: ``import torch`` at the top of the training script. Start methods
    that re-import ``__main__`` in the child (multiprocessing spawn/forkserver) would give
    every worker torch; ours do not."""
    proc = start_script(
        """
        import torch
        from rlstash.envs import ProcessPoolVectorEnv
        from rlstash.envs.testing import CountEnv
        for method in ("forkserver", "spawn"):
            with ProcessPoolVectorEnv(CountEnv, 2, num_workers=2, context=method) as pool:
                has = [any(m.split(".")[0] == "torch" for m in i["modules"]) for i in pool.worker_info()]
                print("TORCH", method, has, flush=True)
        """
    )
    try:
        for method in ("forkserver", "spawn"):
            assert wait_for_line(proc, "TORCH", 60) == f"TORCH {method} [False, False]"
        assert proc.wait(30) == 0
    finally:
        kill_tree(proc)


def test_workers_ignore_sigint_and_rss_is_small():
    with ProcessPoolVectorEnv("CartPole-v1", 8, num_workers=2) as pool:
        pool.reset(seed=0)
        for pid in pool.worker_pids:
            os.kill(pid, signal.SIGINT)
        time.sleep(0.1)
        pool.step(np.zeros(8, dtype=np.int64))
        assert pool.restarts == []
        rss = [psutil.Process(pid).memory_info().rss for pid in pool.worker_pids]
        assert max(rss) < 60 * 2**20, rss  # measured ~30 MB (forkserver), design limit 40 MB
