"""PPO on CartPole-v1 from the library's pieces: pool -> collector -> rollout -> PPO.update.

`rlstash train --algo ppo` runs the same alternation (rlstash/train/onpolicy.py) plus
evaluation, checkpoints and logs.

python examples/ppo_cartpole.py            # until the last 20 episodes average >= 475
python examples/ppo_cartpole.py --quick    # a few seconds (what CI runs)
"""

import sys

from rlstash import PPO, Collector, PPOConfig, ProcessPoolVectorEnv, RolloutStorage, Spec

quick = "--quick" in sys.argv
cfg = PPOConfig.for_env("CartPole-v1", total_steps=100_000)  # the RL Zoo's: 8 envs x 32 steps
agent = PPO((4,), 2, config=cfg)  # 2 discrete actions
spec = Spec({"obs": ((4,), "float32"), "action": ((), "int64")})
with ProcessPoolVectorEnv(
    "CartPole-v1", num_envs=cfg.num_envs, num_workers=0, seed=0, autoreset_mode="SameStep"
) as env:
    collector = Collector(env, agent.act, cfg.rollout_steps * cfg.num_envs)
    rollout = RolloutStorage(spec, cfg.rollout_steps, cfg.num_envs, same_step=True)
    steps = 0
    while steps < (1024 if quick else cfg.total_steps):
        rollout.add(collector.collect(), collector.next_obs)  # [T, N] + the obs after it
        metrics = agent.update(rollout)  # GAE, then n_epochs of clipped-surrogate steps
        steps += rollout.size
        if collector.stats.mean_return(20) >= 475:
            break
    print(f"{steps} env steps, mean return of the last 20 episodes "
          f"{collector.stats.mean_return(20):.1f}, approx KL {float(metrics['approx_kl']):.4f}")  # fmt: skip
