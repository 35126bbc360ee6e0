"""Discrete SAC with 100,000 actions: actions are int64 indices, nothing is one-hot.

A contextual bandit: 16 contexts, each with one rewarding action out of 100,000. The
critic and policy heads score the state against the action table in chunks, so memory per
update grows with batch x chunk, never with batch x actions x width.

    python examples/discrete_sac_huge_actions.py           # 400 updates
    python examples/discrete_sac_huge_actions.py --quick   # a few updates (what CI runs)
"""

import sys

import torch

from rlstash.agents.sac_discrete import DiscreteSAC, DiscreteSACConfig

quick = "--quick" in sys.argv
n_actions, n_contexts, batch = 100_000, 16, 64
gen = torch.Generator().manual_seed(0)
good = torch.randint(0, n_actions, (n_contexts,), generator=gen)  # the rewarding action per context

cfg = DiscreteSACConfig(learning_rate=1e-3, init_alpha=0.05, net_arch=(64,), action_chunk=16_384)
agent = DiscreteSAC((n_contexts,), n_actions, cfg)
eye = torch.eye(n_contexts)
for update in range(5 if quick else 400):
    ctx = torch.randint(0, n_contexts, (batch,), generator=gen)
    obs = eye[ctx]  # [B, 16] context features
    action = agent.act(obs)  # [B] int64 indices
    reward = (action == good[ctx]).float()
    stats = agent.update(
        {
            "obs": obs,
            "action": action,
            "reward": reward,
            "next_obs": obs,
            "terminated": torch.ones(batch, dtype=torch.bool),
        }
    )
    if update % 50 == 0:
        greedy = agent.act(eye, deterministic=True)
        print(
            f"update {update}: greedy hits {(greedy == good).float().mean():.2f}, alpha {agent.alpha:.3f}"
        )
print("done: no one-hot of 100,000 actions was built")
