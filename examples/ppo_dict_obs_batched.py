"""PPO on a batched torch env whose observations are dicts, as Isaac Lab's are: observation
groups ``{"policy": [N, 4], "critic": {...}}``. The collector hands the policy the dict, the
rollout storage keeps each key as an ``obs/<key>`` field on the env's device, and PPO's
networks take the keys of ``obs_keys`` flattened and concatenated (here the actor's group only,
as Isaac Lab's actors do).

python examples/ppo_dict_obs_batched.py            # until the last 100 episodes average >= 475
python examples/ppo_dict_obs_batched.py --quick    # a few seconds (what CI runs)
"""

import sys

import gymnasium as gym
import torch
from gymnasium import spaces

import rlstash  # registers rlstash/CartPole-v1
from rlstash import PPO, Collector, PPOConfig, RolloutStorage, Spec


class ObservationGroups(gym.vector.VectorWrapper):
    """A batched env's observations as groups (what Isaac Lab's envs return): "policy" is the
    state the actor may see, "critic" holds extra (here derived) state."""

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        super().__init__(env)
        box = env.single_observation_space
        extra = spaces.Box(-float("inf"), float("inf"), (1,), box.dtype)
        self.single_observation_space = spaces.Dict(
            {"policy": box, "critic": spaces.Dict({"energy": extra})}
        )
        self.device = env.unwrapped.device  # a batched torch env: tensors on this device

    @staticmethod
    def groups(obs: torch.Tensor) -> dict:
        return {"policy": obs, "critic": {"energy": (obs[:, 1:2] ** 2 + obs[:, 3:4] ** 2)}}

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self.groups(obs), info

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.env.step(actions)
        if "final_obs" in info:  # same-step autoreset: the final observations, as groups too
            info = {**info, "final_obs": self.groups(info["final_obs"])}
        return self.groups(obs), reward, terminated, truncated, info


quick = "--quick" in sys.argv
n, T = (64, 8) if quick else (1024, 16)
env = ObservationGroups(
    gym.make_vec("rlstash/CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")
)
cfg = PPOConfig.for_env(
    "CartPole-v1", num_envs=n, rollout_steps=T, minibatch_size=min(4096, n * T), n_epochs=10,
    total_steps=4_000_000, obs_keys=("policy",), seed=0,
)  # fmt: skip
shapes = rlstash.obs_shapes(env.single_observation_space)  # {"critic/energy": (1,), "policy": (4,)}
agent = PPO(shapes, 2, config=cfg)  # its networks see the 4 "policy" numbers
spec = Spec.from_space(env.single_observation_space)  # obs/critic/energy, obs/policy
spec = Spec({**spec, "action": ((), "int64")})
collector = Collector(env, agent.act, n * T, seed=0)
rollout = RolloutStorage(spec, T, n, device=env.device, same_step=collector.same_step)
steps = 0
while steps < (2 * n * T if quick else 20_000_000):
    rollout.add(collector.collect(), collector.next_obs)  # dicts in, obs/<key> fields stored
    metrics = agent.update(rollout)
    steps += n * T
    if collector.stats.count >= 100 and collector.stats.mean_return(100) >= 475:
        break
print(f"{steps} env steps, mean return of the last 100 episodes "
      f"{collector.stats.mean_return(100):.1f}, approx KL {float(metrics['approx_kl']):.4f}")  # fmt: skip
env.close()
