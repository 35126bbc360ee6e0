"""``--env module:EnvId`` imports ``module`` for its gymnasium registrations, then makes
``EnvId``. Fault class: a module that did not register ``EnvId`` (a backend name such as
``envpool``, any other module) silently made gymnasium's own env of that name, e.g.
``envpool:CartPole-v1`` trained gymnasium's CartPole. Now refused with the fix, by one check
(:func:`rlstash.envs.registry.check_registered_by`); ids the module registers still work."""

from __future__ import annotations

import sys
import types

import pytest

from rlstash.envs.make import probe_env
from rlstash.envs.registry import make


@pytest.fixture
def backend_named_module(monkeypatch):
    """A module named ``envpool`` that registers nothing with gymnasium (as EnvPool does),
    whether or not envpool is installed."""
    monkeypatch.setitem(sys.modules, "envpool", types.ModuleType("envpool"))


@pytest.mark.parametrize("maker", [make, probe_env], ids=["make", "probe_env"])
def test_a_backend_name_before_the_colon_is_refused(backend_named_module, maker):
    with pytest.raises(ValueError, match=r"--env CartPole-v1 --env-backend envpool"):
        maker("envpool:CartPole-v1")


def test_a_module_that_did_not_register_the_id_is_refused():
    with pytest.raises(ValueError, match=r"module 'json' does not register 'Pendulum-v1'"):
        make("json:Pendulum-v1")


def test_ids_the_module_registers_still_work():
    env = make("tests.faults.huge_actions:HugeActions-v0")
    env.close()
    env = make("gymnasium:CartPole-v1")  # gymnasium's own module: its own ids
    env.close()
