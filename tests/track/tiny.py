"""The smallest DQN run on CartPole-v1 the tracking tests train (two evaluations)."""

TINY = {
    "steps": 256, "eval_every": 128, "eval_episodes": 2, "quiet": True, "device": "cpu",
    "batch_size": 16, "learning_starts": 64, "train_freq": 32, "gradient_steps": 2,
    "buffer_size": 8192, "agent": {"net_arch": [16]},
}  # fmt: skip
