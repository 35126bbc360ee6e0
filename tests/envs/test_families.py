"""Env ids of packages that register on import: ALE/..., dm_control/..., module:EnvId (issue 10).
Tests of a family whose package is missing are skipped with the reason."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from rlstash.envs import ProcessPoolVectorEnv
from rlstash.envs.registry import register_family

pytestmark = pytest.mark.multiproc

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def _missing(package: str) -> bool:
    return importlib.util.find_spec(package) is None


def test_module_colon_id_registers_in_a_fresh_process():
    """``module:EnvId``: the module is imported (it registers the id), in the pool's process
    and in the workers, without the caller importing it first."""
    code = (
        "import sys, numpy as np\n"
        "from rlstash.envs import ProcessPoolVectorEnv\n"
        "assert 'rlstash.envs.testing' not in sys.modules\n"
        "with ProcessPoolVectorEnv('rlstash.envs.testing:rlstash/Count-v0', 2, num_workers=2,"
        " env_kwargs={'episode_len': 3}) as pool:\n"
        "    obs, _ = pool.reset(seed=0)\n"
        "    obs, r, *_ = pool.step(np.zeros(2, dtype=np.int64))\n"
        "    print(obs.tolist(), r.tolist())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("[[0")


@pytest.mark.skipif(not _missing("ale_py"), reason="ale-py is installed")
def test_missing_family_package_names_the_extra():
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'rlstash\[atari\]'"):
        register_family("ALE/Pong-v5")
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'rlstash\[atari\]'"):
        ProcessPoolVectorEnv("ALE/Pong-v5", 2, num_workers=0)


@pytest.mark.skipif(_missing("ale_py"), reason="ale-py is not installed (rlstash[atari])")
def test_ale_ids_work_in_workers():
    with ProcessPoolVectorEnv("ALE/Pong-v5", 2, num_workers=2) as pool:
        obs, _ = pool.reset(seed=0)
        assert obs.shape == (2, 210, 160, 3) and obs.dtype == np.uint8
        pool.step(np.zeros(2, dtype=np.int64))
        assert not any("torch" in m for info in pool.worker_info() for m in info["modules"])


@pytest.mark.skipif(
    _missing("shimmy") or _missing("dm_control"),
    reason="shimmy/dm_control are not installed (rlstash[dmc])",
)
def test_dm_control_ids_work_in_workers():
    with ProcessPoolVectorEnv("dm_control/cartpole-balance-v0", 2, num_workers=2) as pool:
        pool.reset(seed=0)
        pool.step(pool.action_space.sample())


@pytest.mark.skipif(_missing("mujoco"), reason="mujoco is not installed (rlstash[mujoco])")
def test_mujoco_ids_work_in_workers():
    with ProcessPoolVectorEnv("HalfCheetah-v5", 2, num_workers=2) as pool:
        obs, _ = pool.reset(seed=0)
        assert obs.shape == (2, 17)
        pool.step(pool.action_space.sample())
