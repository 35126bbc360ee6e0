"""``rlstash train --env ALE/...`` (issue 14): presets, single frames in the stream storage
with stacks rebuilt on read, DQN / PPO on the Nature CNN, full-game evaluation, videos.
Tiny budgets (a few hundred env steps, one Pong game per evaluation)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlstash.train import algos, builders
from rlstash.train.config import TrainConfig
from rlstash.train.evaluate import evaluate_run
from rlstash.train.loop import train

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ale_py") is None or importlib.util.find_spec("cv2") is None,
    reason="ale-py / opencv are not installed (pip install 'rlstash[atari]')",
)
HAS_VIDEO = all(importlib.util.find_spec(p) for p in ("imageio", "imageio_ffmpeg"))
TINY = dict(
    steps=96,
    learning_starts=32,
    batch_size=8,
    buffer_size=512,
    eval_every=96,
    eval_episodes=1,
    device="cpu",
)


def test_any_ale_id_gets_the_atari_presets():
    cfg, agent_cfg = algos.resolve(TrainConfig(env="ALE/Qbert-v5"), spaces.Discrete(6))
    assert (cfg.buffer_size, cfg.learning_starts, cfg.train_freq) == (100_000, 80_000, 4)
    assert (cfg.eval_every, cfg.eval_episodes, cfg.checkpoint_every) == (50_000, 10, 50_000)
    assert agent_cfg.target_update_interval == 250 and agent_cfg.exploration_final_eps == 0.01
    cfg, ppo_cfg = algos.resolve(TrainConfig(algo="ppo", env="ALE/Pong-v5"), spaces.Discrete(6))
    assert (ppo_cfg.num_envs, ppo_cfg.rollout_steps, ppo_cfg.n_epochs) == (8, 128, 4)
    assert (ppo_cfg.clip_range, ppo_cfg.ent_coef, ppo_cfg.learning_rate) == (0.1, 0.01, 2.5e-4)
    cfg, _ = algos.resolve(TrainConfig(env="CartPole-v1"), spaces.Discrete(2))
    assert (cfg.eval_every, cfg.eval_episodes, cfg.checkpoint_every) == (1000, 10, 10_000)
    given = TrainConfig(env="ALE/Pong-v5", eval_every=7, eval_episodes=3, buffer_size=1000,
                        checkpoint_every=9)  # fmt: skip
    cfg, _ = algos.resolve(given, spaces.Discrete(6))
    assert (cfg.eval_every, cfg.eval_episodes, cfg.buffer_size, cfg.checkpoint_every) == (
        7, 3, 1000, 9,
    )  # fmt: skip


def test_probe_sees_stacks_and_history_is_refused():
    info = builders.probe_env("ALE/Pong-v5")
    assert info.obs_space.shape == (4, 84, 84) and info.obs_space.dtype == np.uint8
    assert info.frame_stack == 4
    with pytest.raises(ValueError, match="history: ALE/Pong-v5 already sees stacks of 4"):
        builders.probe_env("ALE/Pong-v5", history=4)


def test_dqn_stores_single_frames_and_samples_the_stacks_the_policy_saw(tmp_path):
    """One 84x84 frame per slot; a sampled obs/next_obs is the [4, 84, 84] stack the env gave."""
    cfg = TrainConfig(env="ALE/Pong-v5", run_dir=str(tmp_path), quiet=True, **TINY)
    run = builders.build_run(cfg, tmp_path / "run")
    try:
        st = run.rb.storage
        assert st.reads.frame_stack == 4 and st.stacked_input
        assert st.slot_spec["obs"].shape == (84, 84)  # each frame stored once
        assert isinstance(run.agent.nets["q"].encoder.features, torch.nn.Module)
        assert type(run.agent.nets["q"].encoder.features).__name__ == "NatureCNN"
        seen: list[np.ndarray] = []
        for _ in range(4):
            batch = run.collector.collect()
            run.rb.extend(batch)
            seen += [o.numpy() for o in batch["obs"].reshape(-1, 4, 84, 84)]
        sample = run.rb.sample(32)
        assert sample["obs"].shape == (32, 4, 84, 84) and sample["obs"].dtype == torch.uint8
        stacks = {o.tobytes() for o in seen}
        assert all(o.numpy().tobytes() in stacks for o in sample["obs"])
    finally:
        run.close()


@pytest.mark.slow  # two full games of Pong
@pytest.mark.skipif(not HAS_VIDEO, reason="imageio / imageio-ffmpeg missing (rlstash[video])")
def test_dqn_trains_and_evaluates_full_games_with_videos(tmp_path):
    result = train(TrainConfig(env="ALE/Pong-v5", run_dir=str(tmp_path), name="dqn", quiet=True,
                               video=True, **TINY))  # fmt: skip
    assert result.steps == 96
    # one full game: Pong ends at 21 points, the score is the game's (-21..21, not one life)
    assert -21 <= result.last_eval <= 21 and result.last_eval < -1
    videos = sorted((result.run_dir / "videos").glob("*.mp4"))
    assert [v.name for v in videos] == ["step-000000096.mp4"]
    out = evaluate_run(result.run_dir, episodes=1, seed=3, video=True)
    assert out["videos"].tolist() == [str(result.run_dir / "videos" / "eval-s3-0.mp4")]
    assert _frames(out["videos"][0]) == int(out["lengths"][0]) + 1  # reset frame + each step


def test_ppo_trains_on_atari_and_evaluates_a_full_game(tmp_path):
    cfg = TrainConfig(
        algo="ppo", env="ALE/Breakout-v5", steps=64, eval_every=64, eval_episodes=1,
        run_dir=str(tmp_path), device="cpu", quiet=True,
        agent={"rollout_steps": 8, "minibatch_size": 32, "n_epochs": 1},
    )  # fmt: skip
    result = train(cfg)
    assert result.steps == 64 and result.last_eval >= 0  # a Breakout score, never clipped below
    from rlstash.train import checkpoint

    state = checkpoint.load_state(checkpoint.latest(result.run_dir))
    agent = state["config"]["agent"]
    assert (agent["num_envs"], agent["clip_range"], agent["ent_coef"]) == (8, 0.1, 0.01)


def test_ppo_image_policy_shares_one_nature_cnn():
    """CleanRL's ppo_atari: one CNN trunk, a policy head and a value head on its features."""
    from rlstash.agents.ppo import PPO

    agent = PPO((4, 84, 84), 4)
    policy = agent.nets["policy"]
    assert policy.shared_trunk and policy.critic[0] is policy.actor_trunk
    assert type(policy.actor_trunk[0]).__name__ == "NatureCNN"
    obs = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    assert agent.act(obs).shape == (3,)
    n_trunk = sum(p.numel() for p in policy.actor_trunk.parameters())
    n_heads = sum(p.numel() for p in policy.head.parameters()) + 512 + 1
    assert sum(p.numel() for p in policy.parameters()) == n_trunk + n_heads
    assert PPO((8,), 2).nets["policy"].shared_trunk is False  # MLPs stay separate (SB3)


def _frames(path: str) -> int:
    import imageio.v2 as imageio

    with imageio.get_reader(path) as reader:
        return reader.count_frames()


def test_compress_flag_builds_a_compressed_replay_and_resume_keeps_it(tmp_path):
    """--compress lz4: the run's replay keeps its frames lz4-compressed (stacks read back as
    the env gave them); the setting is in the checkpoint's config and a resumed run's buffer
    is compressed the same way."""
    from rlstash.storage.frame_backing import FrameBacking
    from rlstash.storage.frames import FrameCompression
    from rlstash.train import checkpoint

    cfg = TrainConfig(env="ALE/Pong-v5", run_dir=str(tmp_path), quiet=True, compress="lz4",
                      compress_budget=0.2, **TINY)  # fmt: skip
    want = FrameCompression("lz4", delta=False, budget=0.2)
    run = builders.build_run(cfg, tmp_path / "run")
    try:
        backing = run.rb.storage.backing
        assert isinstance(backing, FrameBacking) and backing.comp == want
        seen: list[bytes] = []
        for _ in range(3):
            batch = run.collector.collect()
            run.rb.extend(batch)
            seen += [o.numpy().tobytes() for o in batch["obs"].reshape(-1, 4, 84, 84)]
        sample = run.rb.sample(16)
        assert all(o.numpy().tobytes() in set(seen) for o in sample["obs"])
        assert backing.stats()["ratio"] < 0.2  # Pong frames: a few % of a raw frame
        run.step = 24
        checkpoint.save(run.run_dir, run.state(), run.rb)
    finally:
        run.close()
    state = checkpoint.load_state(checkpoint.latest(tmp_path / "run"))
    saved = TrainConfig(**state["config"])
    assert (saved.compress, saved.compress_budget, saved.compress_delta) == ("lz4", 0.2, False)
    again = builders.build_run(saved, tmp_path / "run", state)
    try:
        assert again.rb.storage.backing.comp == want
        assert len(again.rb) == len(run.rb) > 0
        sample = again.rb.sample(16)
        assert all(o.numpy().tobytes() in set(seen) for o in sample["obs"])
    finally:
        again.close()


def test_ppo_refuses_compress(tmp_path):
    cfg = TrainConfig(algo="ppo", env="ALE/Pong-v5", run_dir=str(tmp_path), compress="lz4")
    with pytest.raises(ValueError, match="compress: --algo ppo keeps one rollout"):
        builders.build_run(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
