"""Every algorithm's per-env presets, in one place: env id (or ``"atari"``, any ALE id without
its own entry) -> settings. Data only, importing nothing, so both sides read it without an
upward import: :mod:`rlstash.train.algos` registers each table with its algorithm (a preset is
one flat dict: keys that are :class:`~rlstash.train.config.TrainConfig` fields set the loop,
the others the agent's config), and :meth:`rlstash.agents.ppo.PPOConfig.for_env` reads
:data:`PPO_PRESETS` (agent settings only).
"""

from __future__ import annotations

from typing import Any

# Tuned presets (bench/learn.py, bench/results/learn.md). CartPole-v1 starts from the RL Zoo's
# (rl-baselines3-zoo hyperparams/dqn.yml: lr 2.3e-3, batch 64, 128 updates every 256 env steps,
# target frozen through each burst, epsilon 1 -> 0.04 over 16% of 50k steps) and changes:
# - net (64, 64) instead of (256, 256): ~2x cheaper updates, learns as fast here;
# - 5-step returns (rebuilt by the stream storage): value reaches back 5x faster per target copy;
# - the learning rate decays linearly to 0 over total_steps (the zoo's "lin_" schedule): with a
#   constant 2.3e-3, Q-values overshoot 1 / (1 - gamma) once the policy balances and the greedy
#   policy collapses (seen on most seeds between 25k and 40k steps);
# - buffer_size = total_steps (the zoo's 100k never fills in its 50k steps; a buffer sized to the
#   run samples valid rows without rejection rounds).
DQN_PRESETS: dict[str, dict[str, Any]] = {
    "CartPole-v1": dict(
        learning_rate=2.3e-3,
        lr_schedule="linear",
        batch_size=64,
        buffer_size=50_000,
        learning_starts=1000,
        gamma=0.99,
        n_steps=5,
        target_update_interval=128,
        train_freq=256,
        gradient_steps=128,
        exploration_fraction=0.16,
        exploration_final_eps=0.04,
        net_arch=(64, 64),
        total_steps=50_000,
    ),
}

# Any ALE id (rlstash.envs.atari preprocessing, stacks of 4 rebuilt by the stream storage, the
# Nature CNN): CleanRL's dqn_atari.py (= the RL Zoo's atari DQN but for learning_starts) with
# - buffer_size 100,000 frames (the RL Zoo's; CleanRL's 1,000,000 is 7 GB of frames, more than
#   the memory planner grants on a 24 GB machine shared with others; give --buffer-size to raise
#   it where RAM allows);
# - target_update_interval 250 updates = CleanRL's 1,000 env steps at train_freq 4;
# - the Huber loss and gradient-norm clip 10 of SB3 (CleanRL: MSE, no clip), double DQN;
# - evaluation every 50,000 steps on 10 full games (unclipped score, all lives);
# - a checkpoint every 50,000 steps (not the default 10,000: each one writes the whole replay,
#   0.7 GB at 100,000 frames).
DQN_PRESETS["atari"] = dict(
    learning_rate=1e-4, batch_size=32, buffer_size=100_000, learning_starts=80_000,
    gamma=0.99, n_steps=1, train_freq=4, gradient_steps=1, target_update_interval=250,
    exploration_fraction=0.1, exploration_final_eps=0.01, total_steps=10_000_000,
    eval_every=50_000, eval_episodes=10, checkpoint_every=50_000,
)  # fmt: skip

# Pendulum-v1 starts from the RL Zoo's (hyperparams/sac.yml: lr 1e-3, 20k steps, SB3 defaults
# otherwise) and changes:
# - net (64, 64) instead of (256, 256): updates ~3x cheaper, learns as fast in env steps;
# - 2-step returns: first evaluation >= -200 a little earlier (3-step was earlier still but
#   left one seed of three stuck near -190);
# - buffer_size = 20k, the run's length (1M would hold the 20k steps of the run 50 times over;
#   a buffer sized to the run samples valid rows without rejection rounds).
SAC_PRESETS: dict[str, dict[str, Any]] = {
    "Pendulum-v1": dict(learning_rate=1e-3, net_arch=(64, 64), n_steps=2, buffer_size=20_000),
}


# CartPole-v1 and HalfCheetah-v5: the tuned entries of rl-baselines3-zoo hyperparams/ppo.yml
# (CartPole-v1, HalfCheetah-v3). The Zoo's HalfCheetah: VecNormalize of observations and rewards
# (clip 10, the return discounted with the algorithm's gamma: norm_obs, norm_reward), 1 env,
# constant learning rate and clip range, separate (256, 256) ReLU policy and value nets with
# PyTorch's default init and log std starting at -2; SB3's value loss is the plain MSE, as ours.
# Hopper-v5, Walker2d-v5, Ant-v5: CleanRL's ppo_continuous_action.py (its generic MuJoCo
# setting; the Zoo's Ant entry is SB3's defaults with normalisation, close to it). HalfCheetah
# had it too: 3-4x lower returns at 300k env steps than the Zoo's entry (bench/results/learn.md).
CLEANRL_MUJOCO: dict[str, Any] = {
    "rollout_steps": 2048, "minibatch_size": 64, "n_epochs": 10, "learning_rate": 3e-4,
    "anneal_lr": True, "clip_range_vf": 0.2, "norm_obs": True, "norm_reward": True,
}  # fmt: skip
ZOO_HALF_CHEETAH: dict[str, Any] = {
    "rollout_steps": 512, "minibatch_size": 64, "n_epochs": 20, "gamma": 0.98,
    "gae_lambda": 0.92, "learning_rate": 2.0633e-05, "ent_coef": 0.000401762,
    "clip_range": 0.1, "max_grad_norm": 0.8, "vf_coef": 0.58096, "norm_obs": True,
    "norm_reward": True, "net_arch": (256, 256), "activation": "relu", "ortho_init": False,
    "log_std_init": -2.0,
}  # fmt: skip
PPO_PRESETS: dict[str, dict[str, Any]] = {
    "CartPole-v1": {
        "num_envs": 8,
        "rollout_steps": 32,
        "minibatch_size": 256,
        "gae_lambda": 0.8,
        "gamma": 0.98,
        "n_epochs": 20,
        "ent_coef": 0.0,
        "learning_rate": 1e-3,
        "anneal_lr": True,
        "anneal_clip_range": True,
    },  # fmt: skip
    "HalfCheetah-v5": dict(ZOO_HALF_CHEETAH),
    **{env: dict(CLEANRL_MUJOCO) for env in ("Hopper-v5", "Walker2d-v5", "Ant-v5")},
}


# Any ALE id: CleanRL's ppo_atari.py: 8 envs x 128 steps, 4 minibatches (of 256), 4 epochs,
# lr 2.5e-4 annealed, clip 0.1 (not annealed) on the ratio and the value, entropy 0.01,
# gradient-norm clip 0.5, one Nature CNN shared by actor and critic (rlstash.agents.policies).
# CleanRL's value loss is 0.5 * mean(max(...)) times vf_coef 0.5; ours has no 0.5, so 0.25.
PPO_ATARI: dict[str, Any] = dict(
    num_envs=8, rollout_steps=128, minibatch_size=256, n_epochs=4, learning_rate=2.5e-4,
    anneal_lr=True, gamma=0.99, gae_lambda=0.95, clip_range=0.1, clip_range_vf=0.1,
    ent_coef=0.01, vf_coef=0.25, max_grad_norm=0.5, eval_every=50_000, eval_episodes=10,
)  # fmt: skip


# TD3 Pendulum-v1 starts from the RL Zoo's (hyperparams/td3.yml: lr 1e-3, gamma 0.98, Gaussian
# exploration noise 0.1, 20k steps, net (400, 300), learning_starts 10,000 random steps) and
# changes:
# - net (64, 64) instead of (400, 300): updates ~10x cheaper in FLOPs, learns as fast here;
# - 1,000 random steps and learning_starts 1,000 instead of 10,000 (half of the zoo's run);
# - buffer_size = 20k, the run's length.
TD3_PRESETS: dict[str, dict[str, Any]] = {
    "Pendulum-v1": dict(
        learning_rate=1e-3, gamma=0.98, net_arch=(64, 64), exploration_noise=0.1,
        random_steps=1000, learning_starts=1000, buffer_size=20_000,
    ),
}  # fmt: skip
