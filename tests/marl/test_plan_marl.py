"""``rlstash plan --algo mappo|ippo --env ENV --envs N``: the multi-agent rollout's plan, its
bytes those the run's rollout allocates, refused (exit 1) when it does not fit; flags that only
make sense together are refused in one line naming the flag."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("vmas", reason="VMAS is an optional extra: pip install 'rlstash[vmas]'")

from rlstash import cli  # noqa: E402
from rlstash.train import builders  # noqa: E402
from rlstash.train.config import TrainConfig  # noqa: E402

KWARGS = '{"max_steps": 20}'


def _rows(out: str) -> dict[str, int]:
    """field -> bytes, from the plan's table (``name  shape  dtype  bytes/row  bytes  human``)."""
    rows = {}
    for line in out.splitlines():
        m = re.match(r"^(\w+)\s+\S+\s+\S+\s+[\d,]+\s+([\d,]+)\s", line)
        m = m or re.match(r"^(total)\s+[\d,]+\s+([\d,]+)\s", line)  # no shape, no dtype
        if m:
            rows[m.group(1)] = int(m.group(2).replace(",", ""))
    return rows


@pytest.mark.parametrize("algo", ["mappo", "ippo"])
def test_printed_bytes_equal_what_the_run_allocates(tmp_path: Path, capsys, algo: str) -> None:
    argv = ["plan", "--algo", algo, "--env", "vmas/navigation", "--envs", "4"]
    assert cli.main([*argv, "--env-kwargs", KWARGS]) == 0
    out = capsys.readouterr().out
    assert f"--algo {algo} on vmas/navigation: T=1500 steps x E=4 envs x A=3 agents" in out
    printed = _rows(out)
    cfg = TrainConfig(algo=algo, env="vmas/navigation", envs=4, env_kwargs=KWARGS,
                      device="cpu", run_dir=str(tmp_path), quiet=True)  # fmt: skip
    run = builders.build_run(cfg, tmp_path / "r")
    try:
        r = run.rollout
        allocated = {
            n: getattr(r, n).numel() * getattr(r, n).element_size()
            for n in ("obs", "action", "logp", "reward", "final_value", "terminated", "cont",
                      "mask")
        }  # fmt: skip
        assert r.state is None and "state" not in printed  # navigation has no global state
        assert {n: printed[n] for n in allocated} == allocated
        assert printed["total"] == r.nbytes == sum(allocated.values())
        assert f"{r.nbytes:,}" in out
    finally:
        run.close()


def test_a_rollout_that_does_not_fit_is_refused_with_the_rollouts_line(capsys) -> None:
    argv = ["plan", "--algo", "mappo", "--env", "vmas/navigation", "--envs", str(10**12)]
    assert cli.main(argv) == 1
    out = capsys.readouterr().out
    assert "NO" in out
    assert "does not fit: Not enough memory on ram for a MultiAgentRollout of 1 steps x " in out
    assert "Fix: fewer steps per rollout or fewer envs" in out


@pytest.mark.parametrize(
    "argv, text",
    [
        (["--algo", "dqn", "--env", "CartPole-v1"], "--algo: expected a multi-agent algorithm"),
        (["--algo", "mappo"], "--env: expected the multi-agent env --algo mappo trains"),
        (["--envs", "3"], "--envs: expected a rollout's setting, given with --algo"),
        (["--algo", "mappo", "--env", "vmas/navigation", "--storage", "disk", "--path", "x"],
         "--storage: expected none with --algo mappo"),
    ],
)  # fmt: skip
def test_flags_that_do_not_go_together_are_one_line(capsys, argv: list, text: str) -> None:
    assert cli.main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert text in err and "Traceback" not in err
