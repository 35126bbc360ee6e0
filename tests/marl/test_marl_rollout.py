"""MultiAgentRollout (rlstash.storage.marl_rollout): planned to the byte, refused before
allocating what does not fit, each observation stored once."""

from __future__ import annotations

import pytest
import torch

from rlstash.memory import InsufficientMemoryError
from rlstash.storage.marl_rollout import MultiAgentRollout, naive_bytes_per_step


@pytest.mark.parametrize(
    "kw",
    [dict(), dict(state_dim=7), dict(action_shape=(), action_dtype=torch.int64, n_action_mask=5)],
    ids=["box", "state", "discrete-masked"],
)
def test_plan_equals_what_is_allocated(kw: dict) -> None:
    kw = {"action_shape": (2,), **kw}
    plan = MultiAgentRollout.plan_bytes(10, 4, 3, 18, **kw)
    r = MultiAgentRollout(10, 4, 3, 18, **kw)
    assert sum(plan.values()) == r.nbytes
    assert (r.state is None) == ("state_dim" not in kw)
    assert (r.action_mask is None) == ("n_action_mask" not in kw)


def test_a_rollout_that_does_not_fit_is_refused_before_allocation() -> None:
    with pytest.raises(InsufficientMemoryError, match="MultiAgentRollout of 1,000,000,000 steps"):
        MultiAgentRollout(10**9, 1024, 3, 18, (2,))


@pytest.mark.parametrize("name, value", [("steps", 0), ("n_agents", True), ("obs_dim", 1.5)])
def test_bad_sizes_are_refused_naming_the_field(name: str, value: object) -> None:
    kw = dict(steps=4, num_envs=2, n_agents=3, obs_dim=5)
    kw[name] = value
    with pytest.raises(ValueError, match=f"{name}: expected an int >= 1"):
        MultiAgentRollout(**kw)  # type: ignore[arg-type]


def test_each_observation_is_stored_once() -> None:
    T, E, A, D = 600, 10, 3, 18
    r = MultiAgentRollout(T, E, A, D, (2,))
    ours = r.nbytes / (T * E)
    naive = naive_bytes_per_step(A, D, 2)
    assert ours < 0.6 * naive  # next observations are the next row; finals enter as values
    r.obs[T].fill_(3.0)
    r.carry_over()
    assert (r.obs[0] == 3.0).all()
