"""History: a fixed window, exact over the real steps, memory flat over a 100,000-step episode."""

import gc
import tracemalloc

import psutil
import pytest
import torch

from rlstash.agents.dqn import DQN, DQNConfig
from rlstash.agents.history import HistorySummarizer, HistoryWindow


def test_summarizer_with_lengths_runs_over_the_real_steps_only():
    torch.manual_seed(0)
    summ = HistorySummarizer(obs_dim=3, hidden=5, window=4)
    x = torch.randn(4, 4, 3)
    lengths = torch.tensor([4, 1, 3, 2])
    x[1, :3] = 99.0  # padding must not matter
    out = summ(x, lengths)
    assert out.shape == (4, 5)
    for i, k in enumerate(lengths.tolist()):
        _, (h, _) = summ.lstm(x[i : i + 1, 4 - k :])
        torch.testing.assert_close(out[i], h[-1, 0])
    torch.testing.assert_close(summ(x)[0], out[0])  # full windows: no lengths needed
    with pytest.raises(ValueError, match="lengths"):
        summ(x, torch.tensor([0, 1, 1, 1]))
    with pytest.raises(ValueError, match=r"x: expected a window \[B, 4, 3\]"):
        summ(torch.randn(2, 5, 3))


def test_window_pushes_resets_and_left_padding():
    hist = HistoryWindow(num_envs=2, window=3, obs_dim=1)
    seen = []
    for t in range(5):
        first = torch.tensor([t == 0, t in (0, 3)])
        x, lengths = hist.push(torch.tensor([[float(t)], [10.0 + t]]), first=first)
        seen.append((x[..., 0].tolist(), lengths.tolist()))
    assert seen == [
        ([[0, 0, 0], [0, 0, 10]], [1, 1]),
        ([[0, 0, 1], [0, 10, 11]], [2, 2]),
        ([[0, 1, 2], [10, 11, 12]], [3, 3]),
        ([[1, 2, 3], [0, 0, 13]], [3, 1]),  # env 1 started a new episode
        ([[2, 3, 4], [0, 13, 14]], [3, 2]),
    ]
    with pytest.raises(ValueError, match=r"obs: expected shape \[2, 1\]"):
        hist.push(torch.zeros(3, 1))
    with pytest.raises(ValueError, match="first"):
        hist.push(torch.zeros(2, 1), first=torch.tensor([1, 0]))


def test_memory_is_flat_over_a_100k_step_episode():
    num_envs, window, obs_dim = 4, 8, 3
    hist = HistoryWindow(num_envs, window, obs_dim)
    summ = HistorySummarizer(obs_dim, 16, window)
    ring_ptr, ring_bytes = hist.ring.data_ptr(), hist.nbytes
    obs = torch.zeros(num_envs, obs_dim)
    proc = psutil.Process()

    def run(steps, start):
        for t in range(start, start + steps):
            obs.fill_(t % 97)
            x, lengths = hist.push(obs)
            if t % 1000 == 0:
                with torch.no_grad():
                    assert summ(x, lengths).shape == (num_envs, 16)

    run(10_000, 0)  # warm up allocator caches
    gc.collect()
    rss_before = proc.memory_info().rss
    tracemalloc.start()
    snap = tracemalloc.take_snapshot()
    run(90_000, 10_000)
    gc.collect()
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(snap, "filename"))
    tracemalloc.stop()
    rss_growth = proc.memory_info().rss - rss_before
    assert hist.ring.data_ptr() == ring_ptr and hist.nbytes == ring_bytes == 4 * 8 * 3 * 4 + 4 * 8
    assert int(hist.lengths.max()) == window  # capped at the window, not the episode length
    assert grown < 64 * 1024, f"python heap grew by {grown} bytes over 90,000 steps"
    assert rss_growth < 8 * 2**20, f"RSS grew by {rss_growth / 2**20:.1f} MiB over 90,000 steps"


def test_dqn_with_history_encoder_over_windows():
    agent = DQN((6, 3), 4, DQNConfig(net_arch=(16,), history_hidden=8))
    windows = torch.randn(5, 6, 3)
    assert agent.act(windows).shape == (5,)
    agent.update(
        {
            "obs": windows,
            "action": torch.zeros(5, dtype=torch.int64),
            "reward": torch.ones(5),
            "next_obs": windows,
            "terminated": torch.zeros(5, dtype=torch.bool),
        }
    )
    with pytest.raises(ValueError, match="history_hidden"):
        DQN((6,), 4, DQNConfig(history_hidden=8))


def test_dqn_learns_from_sequence_sampler_windows_of_a_replay_buffer():
    """The sequence sampler feeds the history agent: windows of k steps inside one episode
    become windowed transitions (next window = this one shifted by a step) and train DQN."""
    import numpy as np

    from rlstash.agents.history import transitions_from_windows
    from rlstash.replay import ReplayBuffer
    from rlstash.sampler import SequenceSampler
    from rlstash.spec import Field, Spec
    from rlstash.storage import StreamStorage

    k, n_envs, T = 4, 2, 40
    spec = Spec({"obs": Field((2,), torch.float32), "action": Field((), torch.int64)})
    store = StreamStorage(spec, n_envs, 2 * 64, autoreset="same_step")
    rb = ReplayBuffer(store, sampler=SequenceSampler(k), seed=0)
    # obs = (episode id, step in episode); episodes of 9 steps end terminated
    ep, t = np.zeros(n_envs), np.zeros(n_envs)
    obs_list, terms, finals = [], [], []
    for _ in range(T):
        obs_list.append(np.stack([ep, t], 1).copy())
        end = t == 8
        terms.append(end.copy())
        finals.append(np.stack([ep, t + 1], 1).copy())
        ep, t = np.where(end, ep + 1, ep), np.where(end, 0, t + 1)
    batch = {
        "obs": torch.tensor(np.stack(obs_list), dtype=torch.float32),  # [T, N, 2]
        "action": torch.zeros(T, n_envs, dtype=torch.int64),
        "reward": torch.ones(T, n_envs),
        "terminated": torch.tensor(np.stack(terms)),
        "truncated": torch.zeros(T, n_envs, dtype=torch.bool),
        "final_obs": torch.tensor(np.stack(finals), dtype=torch.float32),
    }
    rb.extend(batch)
    got = transitions_from_windows(rb.sample(32))
    obs, nxt = got["obs"], got["next_obs"]
    assert obs.shape == nxt.shape == (32, k, 2) and got["reward"].shape == (32,)
    assert (obs[:, :, 0] == obs[:, :1, 0]).all()  # one episode per window
    torch.testing.assert_close(obs[:, :, 1], obs[:, :1, 1] + torch.arange(float(k)))
    torch.testing.assert_close(nxt[:, :, 1], obs[:, :, 1] + 1)  # shifted by one step
    assert (got["terminated"] == (obs[:, -1, 1] == 8)).all()
    agent = DQN((k, 2), 3, DQNConfig(net_arch=(16,), history_hidden=8))
    before = [p.clone() for p in agent.nets["q"].parameters()]
    agent.update(got)
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.nets["q"].parameters()))
    with pytest.raises(ValueError, match="next_obs"):
        transitions_from_windows({"obs": obs})
