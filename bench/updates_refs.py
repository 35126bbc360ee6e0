"""The peers of bench/updates.py: Stable-Baselines3's own ``train`` and a minimal CleanRL-style
update per algorithm (each written as CleanRL's single-file scripts do: plain ``nn.Sequential``
networks, ``torch.optim.Adam``, autograd; ``cleanrl/dqn.py``, ``sac_continuous_action.py``,
``sac_atari.py``, ``td3_continuous_action.py``, ``ppo.py``), the eager reference.

Every maker returns ``run(n)``: n gradient steps (off-policy: each on a fresh batch drawn from
10,000 random transitions; PPO: minibatch steps on 512 prepared rows), or None where the
library has no such algorithm (SB3: discrete SAC).
"""

from __future__ import annotations

from typing import Any


def ppo_rollout(rows: int, obs: int, n_actions: int) -> Any:
    """A filled rlstash RolloutStorage of ``rows`` random steps (8 envs)."""
    import torch

    from rlstash.spec import Spec
    from rlstash.storage.rollout import RolloutStorage

    g, envs = torch.Generator().manual_seed(0), 8
    steps = rows // envs
    ro = RolloutStorage(Spec({"obs": ((obs,), "float32"), "action": ((), "int64")}), steps, envs)
    batch = {
        "obs": torch.randn(steps, envs, obs, generator=g),
        "action": torch.randint(0, n_actions, (steps, envs), generator=g),
        "reward": torch.randn(steps, envs, generator=g),
        "terminated": torch.rand(steps, envs, generator=g) < 0.05,
        "truncated": torch.zeros(steps, envs, dtype=torch.bool),
    }
    ro.add(batch, torch.randn(envs, obs, generator=g))
    return ro


# --- Stable-Baselines3 ---------------------------------------------------------------------


def _space_env(obs: int, act: int, discrete: bool) -> Any:
    """A gymnasium env that only has the spaces (SB3 builds its policies from them)."""
    import gymnasium as gym
    import numpy as np

    class SpaceEnv(gym.Env):
        observation_space = gym.spaces.Box(-np.inf, np.inf, (obs,), np.float32)
        action_space = gym.spaces.Discrete(act) if discrete else gym.spaces.Box(-1, 1, (act,))

        def reset(self, seed: Any = None, options: Any = None) -> Any:
            return np.zeros(obs, np.float32), {}

        def step(self, action: Any) -> Any:
            return np.zeros(obs, np.float32), 0.0, False, False, {}

    return SpaceEnv()


def sb3_update(algo: str, net: tuple, dims: tuple, batch: int, rows: int, ppo_rows: int) -> Any:
    import numpy as np
    import torch
    from stable_baselines3 import DQN, PPO, SAC, TD3
    from stable_baselines3.common.logger import configure

    if algo == "sac_discrete":
        return None
    obs, act = dims
    env = _space_env(obs, act, discrete=algo in ("dqn", "ppo"))
    rng = np.random.default_rng(0)
    if algo == "ppo":
        model = PPO("MlpPolicy", env, n_steps=ppo_rows, batch_size=batch, n_epochs=1, device="cpu",
                    policy_kwargs={"net_arch": {"pi": list(net), "vf": list(net)}}, seed=0)  # fmt: skip
        model.set_logger(configure(None, []))
        buf = model.rollout_buffer
        torch.set_grad_enabled(False)  # filling the buffer (SB3 collects under no_grad)
        for _ in range(ppo_rows):
            o = rng.standard_normal((1, obs)).astype(np.float32)
            buf.add(o, np.array([[rng.integers(act)]]), np.array([rng.standard_normal()]),
                    np.array([False]), model.policy.predict_values(model.policy.obs_to_tensor(o)[0]),
                    torch.zeros(1))  # fmt: skip
        buf.compute_returns_and_advantage(torch.zeros(1), np.array([False]))
        torch.set_grad_enabled(True)
        per_epoch = ppo_rows // batch

        def run(n: int) -> None:
            model.n_epochs = max(1, -(-n // per_epoch))  # ceil: n rounded up to whole epochs
            model.train()

        return run
    cls = {"dqn": DQN, "sac": SAC, "td3": TD3}[algo]
    model = cls("MlpPolicy", env, policy_kwargs={"net_arch": list(net)}, batch_size=batch,
                learning_starts=0, buffer_size=rows, device="cpu", seed=0)  # fmt: skip
    model.set_logger(configure(None, []))
    for _ in range(rows):
        o, o2 = rng.standard_normal((2, 1, obs)).astype(np.float32)
        a = np.array([[rng.integers(act)]]) if algo == "dqn" else rng.uniform(-1, 1, (1, act))
        model.replay_buffer.add(o, o2, a, np.array([rng.standard_normal()]),
                                np.array([rng.random() < 0.05]), [{}])  # fmt: skip

    def run(n: int) -> None:
        model.train(gradient_steps=n, batch_size=batch)

    return run


# --- CleanRL-style references --------------------------------------------------------------


def _mlp(i: int, net: tuple, o: int, act: Any = None) -> Any:
    from torch import nn

    layers, d = [], i
    for h in net:
        layers += [nn.Linear(d, h), (act or nn.ReLU)()]
        d = h
    return nn.Sequential(*layers, nn.Linear(d, o))


def cleanrl_update(algo: str, net: tuple, dims: tuple, batch: int, rows: int, ppo_rows: int) -> Any:
    import torch

    torch.manual_seed(0)
    obs, act = dims
    if algo == "ppo":
        return _cleanrl_ppo(net, obs, act, batch, ppo_rows)
    g = torch.Generator().manual_seed(0)
    data = {
        "obs": torch.randn(rows, obs, generator=g),
        "next_obs": torch.randn(rows, obs, generator=g),
        "reward": torch.randn(rows, generator=g),
        "done": (torch.rand(rows, generator=g) < 0.05).float(),
    }
    if algo in ("dqn", "sac_discrete"):
        data["action"] = torch.randint(0, act, (rows,), generator=g)
    else:
        data["action"] = 2 * torch.rand(rows, act, generator=g) - 1
    step = {"dqn": _cleanrl_dqn, "sac": _cleanrl_sac, "td3": _cleanrl_td3,
            "sac_discrete": _cleanrl_sac_discrete}[algo](net, obs, act)  # fmt: skip

    def run(n: int) -> None:
        for _ in range(n):
            idx = torch.randint(0, rows, (batch,))
            step({k: v[idx] for k, v in data.items()})

    return run


def _descend(opt: Any, loss: Any) -> None:
    """CleanRL's optimizer step: zero_grad, backward, step."""
    opt.zero_grad()
    loss.backward()
    opt.step()


def _soft_update(pairs: tuple) -> None:
    """CleanRL's Polyak update (tau 0.005) of each (net, target) pair, parameter by parameter."""
    import torch

    with torch.no_grad():
        for src, dst in pairs:
            for p, tp in zip(src.parameters(), dst.parameters()):
                tp.data.copy_(0.005 * p.data + 0.995 * tp.data)


def _cleanrl_dqn(net: tuple, obs: int, act: int) -> Any:
    import torch
    import torch.nn.functional as F

    q, target = _mlp(obs, net, act), _mlp(obs, net, act)
    target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=2.5e-4)

    def step(d: dict) -> None:
        with torch.no_grad():
            target_max, _ = target(d["next_obs"]).max(dim=1)
            td_target = d["reward"] + 0.99 * target_max * (1 - d["done"])
        old_val = q(d["obs"]).gather(1, d["action"][:, None]).squeeze()
        loss = F.mse_loss(td_target, old_val)
        _descend(opt, loss)

    return step


def _cleanrl_sac(net: tuple, obs: int, act: int) -> Any:
    import torch
    import torch.nn.functional as F

    actor = _mlp(obs, net, 2 * act)
    qf1, qf2 = _mlp(obs + act, net, 1), _mlp(obs + act, net, 1)
    qf1_t, qf2_t = _mlp(obs + act, net, 1), _mlp(obs + act, net, 1)
    qf1_t.load_state_dict(qf1.state_dict())
    qf2_t.load_state_dict(qf2.state_dict())
    q_opt = torch.optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=1e-3)
    a_opt = torch.optim.Adam(actor.parameters(), lr=3e-4)
    log_alpha = torch.zeros(1, requires_grad=True)
    alpha_opt = torch.optim.Adam([log_alpha], lr=1e-3)

    def get_action(x: torch.Tensor) -> tuple:
        mean, log_std = actor(x).chunk(2, -1)
        log_std = -5 + 0.5 * 7 * (torch.tanh(log_std) + 1)
        normal = torch.distributions.Normal(mean, log_std.exp())
        x_t = normal.rsample()
        y_t = torch.tanh(x_t)
        log_prob = (normal.log_prob(x_t) - torch.log(1 - y_t.pow(2) + 1e-6)).sum(1, keepdim=True)
        return y_t, log_prob

    def step(d: dict) -> None:
        alpha = log_alpha.exp().item()
        with torch.no_grad():
            next_a, next_logp = get_action(d["next_obs"])
            x = torch.cat([d["next_obs"], next_a], 1)
            min_q = torch.min(qf1_t(x), qf2_t(x)) - alpha * next_logp
            next_q = d["reward"] + (1 - d["done"]) * 0.99 * min_q.view(-1)
        x = torch.cat([d["obs"], d["action"]], 1)
        qf_loss = F.mse_loss(qf1(x).view(-1), next_q) + F.mse_loss(qf2(x).view(-1), next_q)
        _descend(q_opt, qf_loss)
        pi, log_pi = get_action(d["obs"])
        x = torch.cat([d["obs"], pi], 1)
        actor_loss = (alpha * log_pi - torch.min(qf1(x), qf2(x))).mean()
        _descend(a_opt, actor_loss)
        alpha_loss = (-log_alpha.exp() * (log_pi.detach() - act)).mean()
        _descend(alpha_opt, alpha_loss)
        _soft_update(((qf1, qf1_t), (qf2, qf2_t)))

    return step


def _cleanrl_sac_discrete(net: tuple, obs: int, act: int) -> Any:
    import torch
    import torch.nn.functional as F

    actor, qf1, qf2 = _mlp(obs, net, act), _mlp(obs, net, act), _mlp(obs, net, act)
    qf1_t, qf2_t = _mlp(obs, net, act), _mlp(obs, net, act)
    qf1_t.load_state_dict(qf1.state_dict())
    qf2_t.load_state_dict(qf2.state_dict())
    q_opt = torch.optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=3e-4, eps=1e-4)
    a_opt = torch.optim.Adam(actor.parameters(), lr=3e-4, eps=1e-4)
    log_alpha = torch.zeros(1, requires_grad=True)
    alpha_opt = torch.optim.Adam([log_alpha], lr=3e-4, eps=1e-4)
    target_entropy = 0.89 * torch.log(torch.tensor(float(act)))

    def policy(x: torch.Tensor) -> tuple:
        logits = actor(x)
        log_probs = F.log_softmax(logits, dim=1)
        return log_probs.exp(), log_probs

    def step(d: dict) -> None:
        alpha = log_alpha.exp().item()
        with torch.no_grad():
            probs, log_probs = policy(d["next_obs"])
            min_q = probs * (
                torch.min(qf1_t(d["next_obs"]), qf2_t(d["next_obs"])) - alpha * log_probs
            )
            next_q = d["reward"] + (1 - d["done"]) * 0.99 * min_q.sum(1)
        a = d["action"][:, None]
        q1, q2 = qf1(d["obs"]).gather(1, a).view(-1), qf2(d["obs"]).gather(1, a).view(-1)
        qf_loss = F.mse_loss(q1, next_q) + F.mse_loss(q2, next_q)
        _descend(q_opt, qf_loss)
        probs, log_probs = policy(d["obs"])
        with torch.no_grad():
            min_q = torch.min(qf1(d["obs"]), qf2(d["obs"]))
        actor_loss = (probs * (alpha * log_probs - min_q)).mean()
        _descend(a_opt, actor_loss)
        alpha_loss = (
            probs.detach() * (-log_alpha.exp() * (log_probs + target_entropy).detach())
        ).mean()
        _descend(alpha_opt, alpha_loss)
        _soft_update(((qf1, qf1_t), (qf2, qf2_t)))

    return step


def _cleanrl_td3(net: tuple, obs: int, act: int) -> Any:
    import torch
    import torch.nn.functional as F

    actor, actor_t = _mlp(obs, net, act), _mlp(obs, net, act)
    actor_t.load_state_dict(actor.state_dict())
    qf1, qf2 = _mlp(obs + act, net, 1), _mlp(obs + act, net, 1)
    qf1_t, qf2_t = _mlp(obs + act, net, 1), _mlp(obs + act, net, 1)
    qf1_t.load_state_dict(qf1.state_dict())
    qf2_t.load_state_dict(qf2.state_dict())
    q_opt = torch.optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=3e-4)
    a_opt = torch.optim.Adam(actor.parameters(), lr=3e-4)
    calls = [0]

    def step(d: dict) -> None:
        calls[0] += 1
        with torch.no_grad():
            noise = (torch.randn_like(d["action"]) * 0.2).clamp(-0.5, 0.5)
            next_a = (torch.tanh(actor_t(d["next_obs"])) + noise).clamp(-1, 1)
            x = torch.cat([d["next_obs"], next_a], 1)
            min_q = torch.min(qf1_t(x), qf2_t(x))
            next_q = d["reward"] + (1 - d["done"]) * 0.99 * min_q.view(-1)
        x = torch.cat([d["obs"], d["action"]], 1)
        qf_loss = F.mse_loss(qf1(x).view(-1), next_q) + F.mse_loss(qf2(x).view(-1), next_q)
        _descend(q_opt, qf_loss)
        if calls[0] % 2 == 0:
            x = torch.cat([d["obs"], torch.tanh(actor(d["obs"]))], 1)
            actor_loss = -qf1(x).mean()
            _descend(a_opt, actor_loss)
            _soft_update(((actor, actor_t), (qf1, qf1_t), (qf2, qf2_t)))

    return step


def _cleanrl_ppo(net: tuple, obs: int, act: int, batch: int, rows: int) -> Any:
    import torch
    from torch import nn

    actor, critic = _mlp(obs, net, act, nn.Tanh), _mlp(obs, net, 1, nn.Tanh)
    opt = torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=2.5e-4, eps=1e-5)
    g = torch.Generator().manual_seed(0)
    b_obs = torch.randn(rows, obs, generator=g)
    b_actions = torch.randint(0, act, (rows,), generator=g)
    b_adv, b_ret = torch.randn(rows, generator=g), torch.randn(rows, generator=g)
    with torch.no_grad():
        b_logp = torch.distributions.Categorical(logits=actor(b_obs)).log_prob(b_actions)
        b_values = critic(b_obs).view(-1)
    perms = [torch.randperm(rows, generator=g)[:batch] for _ in range(8)]

    def run(n: int) -> None:
        for i in range(n):
            mb = perms[i % 8]
            dist = torch.distributions.Categorical(logits=actor(b_obs[mb]))
            newlogprob, entropy = dist.log_prob(b_actions[mb]), dist.entropy()
            newvalue = critic(b_obs[mb]).view(-1)
            logratio = newlogprob - b_logp[mb]
            ratio = logratio.exp()
            with torch.no_grad():
                _approx_kl = ((ratio - 1) - logratio).mean()
            adv = b_adv[mb]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg_loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.2)).mean()
            v_clipped = b_values[mb] + torch.clamp(newvalue - b_values[mb], -0.2, 0.2)
            v_loss = (
                0.5 * torch.max((newvalue - b_ret[mb]) ** 2, (v_clipped - b_ret[mb]) ** 2).mean()
            )
            loss = pg_loss - 0.01 * entropy.mean() + v_loss * 0.5
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_([*actor.parameters(), *critic.parameters()], 0.5)
            opt.step()

    return run
