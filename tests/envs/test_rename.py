"""``EnvPool`` (the old name, taken by sail-sg/envpool) still resolves to
:class:`ProcessPoolVectorEnv`, with one FutureWarning per process."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = r"""
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    from rlstash.envs import EnvPool
    from rlstash.envs import EnvPool as again
    import rlstash
    top = rlstash.EnvPool
    from rlstash import ProcessPoolVectorEnv
    from rlstash.envs.process_pool import ProcessPoolVectorEnv as direct
assert EnvPool is again is top is ProcessPoolVectorEnv is direct, (EnvPool, top, direct)
renamed = [w for w in caught if "renamed ProcessPoolVectorEnv" in str(w.message)]
assert len(renamed) == 1, [str(w.message) for w in caught]
w = renamed[0]
assert w.category is FutureWarning, w.category
assert w.filename == "<string>", w.filename  # the user's line, not rlstash's
print("ok")
"""


def test_old_name_is_the_same_class_and_warns_once():
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_new_name_does_not_warn():
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "from rlstash import ProcessPoolVectorEnv\n"
        "from rlstash.envs import ProcessPoolVectorEnv as P\n"
        "import rlstash.envs, rlstash\n"
        "assert P is ProcessPoolVectorEnv and 'EnvPool' not in rlstash.__all__\n"
        "assert 'EnvPool' not in rlstash.envs.__all__\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_unknown_name_still_an_attribute_error():
    import rlstash.envs

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        rlstash.envs.Nope  # noqa: B018
