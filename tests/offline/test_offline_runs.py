"""Offline-to-online with several env lanes and resuming an offline run (issue 26 gaps): the
dataset's episodes are dealt over the ``--envs`` lanes, planned beside ``--buffer-size`` and
still sampled once the envs collect; ``--resume`` of ``--algo iql`` continues its gradient
steps, its learning curve and reads the dataset once."""

from __future__ import annotations

import csv

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlstash.cli.main import main
from rlstash.replay import ReplayBuffer
from rlstash.train import checkpoint
from tests.offline.conftest import collect

minari = pytest.importorskip("minari", reason="Minari tests need rlstash[minari]")
from rlstash.datasets import minari as mds  # noqa: E402
from rlstash.datasets.minari_fill import deal  # noqa: E402


def _train(tmp_path, *argv: str) -> int:
    return main(["train", "--quiet", "--device", "cpu", "--run-dir", str(tmp_path / "runs"),
                 "--set", "net_arch=16,16", "--set", "compile=false", *argv])  # fmt: skip


def test_deal_fills_every_lane_evenly_and_keeps_every_transition():
    for lengths, n in (
        ([5, 7, 3, 9, 1, 4], 3),
        ([50] * 7, 2),
        ([3] * 5, 4),
        ([1, 9, 1, 1, 6], 2),
        ([8], 1),
    ):
        lanes, P = deal(lengths, n)
        assert len(lanes) == n
        assert all(sum(p.slots for p in lane) == P for lane in lanes)
        steps = sorted((p.episode, t) for lane in lanes for p in lane for t in range(p.a, p.b))
        assert steps == sorted((i, t) for i, T in enumerate(lengths) for t in range(T))
    with pytest.raises(ValueError, match="envs: .* give fewer --envs"):
        deal([1, 1], 4)
    with pytest.raises(ValueError, match="envs: "):
        deal([2] * 5, 4)  # the last lane would hold one one-step piece


def test_online_run_with_several_envs_keeps_the_dataset_beside_the_online_steps(
    tmp_path, minari_path
):
    ds = collect("test/pend-v0", gym.make("Pendulum-v1", max_episode_steps=30), steps=150)
    code = _train(tmp_path, "--algo", "sac", "--dataset", "test/pend-v0", "--envs", "3",
                  "--buffer-size", "150", "--steps", "120", "--learning-starts", "30",
                  "--eval-every", "120", "--eval-episodes", "1", "--name", "o2o3")  # fmt: skip
    assert code == 0
    run = tmp_path / "runs" / "o2o3"
    rb = ReplayBuffer.load(run / "checkpoint" / checkpoint.BUFFER)
    try:
        st = rb.storage
        lanes, P = deal(mds.episode_lengths(ds), 3)
        assert st.num_envs == 3
        assert st.capacity == 150 + 3 * P  # the plan counts the dataset and --buffer-size
        assert int(st.lanes.count.min()) >= P + 120 // 3  # the envs collected after it
        # every dataset transition is still held: 40 online steps per lane < 150 // 3
        held = st.read(np.flatnonzero(st.valid))
        eps = list(ds.iterate_episodes())
        pairs = np.concatenate([np.concatenate([e.observations[:-1], e.actions], 1) for e in eps])
        keys = {tuple(np.round(p, 5)) for p in pairs}

        def from_data(batch):  # (obs, action) of a dataset step
            rows = torch.cat([batch["obs"], batch["action"]], 1).numpy()
            return np.array([tuple(np.round(p, 5)) in keys for p in rows])

        is_data = from_data(held)
        assert is_data.sum() == ds.total_steps and (~is_data).sum() > 0
        # and sampled after online collection started, beside the online steps
        assert 0.2 < from_data(rb.sample(2048)).mean() < 0.95
    finally:
        rb.close()


def test_resuming_an_offline_run_continues_its_updates_and_reads_the_dataset_once(
    tmp_path, minari_path, monkeypatch
):
    collect("test/pend-v0", gym.make("Pendulum-v1", max_episode_steps=50), steps=300)
    from rlstash.train import offline

    loads = []
    real = mds.from_minari

    def counting(*args, **kwargs):
        st = real(*args, **kwargs)
        loads.append(int(st.valid.sum()))
        return st

    monkeypatch.setattr(mds, "from_minari", counting)
    save = offline.OfflineLearning.save

    def stop_after_first(self, run):
        path = save(self, run)
        if run.step == 60:
            raise KeyboardInterrupt  # stopped (Ctrl-C) right after its first checkpoint
        return path

    monkeypatch.setattr(offline.OfflineLearning, "save", stop_after_first)
    argv = ["--algo", "iql", "--dataset", "test/pend-v0", "--steps", "120",
            "--gradient-steps", "20", "--eval-every", "60", "--checkpoint-every", "60",
            "--eval-episodes", "1", "--name", "iql"]  # fmt: skip
    assert _train(tmp_path, *argv) == 130  # the CLI's exit code for Ctrl-C
    run = tmp_path / "runs" / "iql"
    stopped = checkpoint.load_state(run / "checkpoint")
    assert stopped["step"] == 60
    monkeypatch.setattr(offline.OfflineLearning, "save", save)

    assert main(["train", "--resume", str(run)]) == 0
    final = checkpoint.load_state(run / "checkpoint")
    assert final["step"] == 120  # gradient steps went on from 60, not from 0
    assert final["agent"]["counters"]["updates"] == 120  # the agent's own count went on too
    assert loads == [300, 300]  # each build read the dataset once, never twice into a buffer
    with open(run / "eval.csv") as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [60, 120]
    with open(run / "progress.csv") as f:
        steps = [int(r["step"]) for r in csv.DictReader(f)]
    # rows are written at most once a second, so the last one may come before step 120
    assert steps == sorted(steps) and steps[-1] > 60 and len(set(steps)) == len(steps)


def test_resuming_on_a_changed_dataset_is_refused(tmp_path, minari_path, capsys):
    collect("test/pend-v0", gym.make("Pendulum-v1", max_episode_steps=50), steps=200, seed=0)
    argv = ["--algo", "iql", "--dataset", "test/pend-v0", "--steps", "20", "--gradient-steps",
            "20", "--eval-every", "20", "--checkpoint-every", "20", "--eval-episodes", "1",
            "--name", "iql"]  # fmt: skip
    assert _train(tmp_path, *argv) == 0
    run = tmp_path / "runs" / "iql"
    recorded = checkpoint.load_state(run / "checkpoint")["settings"]["dataset"]
    assert recorded.startswith("test/pend-v0: 200 steps, 4 episodes, sha256 ")
    assert main(["train", "--resume", str(run)]) == 0  # the same dataset: resumes
    capsys.readouterr()
    minari.delete_dataset("test/pend-v0")  # made again: the same id and counts, other steps
    collect("test/pend-v0", gym.make("Pendulum-v1", max_episode_steps=50), steps=200, seed=1)
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dataset: test/pend-v0 changed since the run's" in err, err
