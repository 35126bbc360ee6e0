"""Every public name resolves, is documented, and importing rlstash stays cheap."""

from __future__ import annotations

import subprocess
import sys

import pytest

import rlstash


@pytest.mark.parametrize("name", rlstash.__all__)
def test_export_resolves_and_has_a_docstring(name):
    obj = getattr(rlstash, name)
    assert obj.__doc__ and obj.__doc__.strip(), f"rlstash.{name} has no docstring"


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        rlstash.nope  # noqa: B018


def test_env_worker_module_does_not_import_torch():
    """I1: env workers never import torch, and importing the package root must not either."""
    code = "import sys, rlstash, rlstash.envs.worker; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
