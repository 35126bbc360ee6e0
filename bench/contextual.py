"""A contextual task with 100,000 actions, and discrete SAC (:func:`run`) and PPO
(:func:`run_ppo`) learning it: chunked vs one-hot.

The task (:class:`ContextualEnv`, a gymnasium env, episodes of one step): ``n_contexts``
contexts (default 16), shown as a one-hot observation; ``n_actions`` actions (default
100,000), each with a fixed random unit feature vector phi(a) in R^d (d = 16). Context c has
one rewarding action a*_c, and

    reward(c, a) = phi(a) . phi(a*_c)   in [-1, 1]:  1 at a*_c only, graded elsewhere,

so an agent that scores actions through their features (rlstash's embedding head with fixed
``action_features``: Q(s, a) = u(s) . phi(a)) can find a*_c without trying 100,000 actions;
a table with a weight row per action could not. With d = 16 the best *other* action of a
context scores about 0.85, so a return near 1 needs the exact action (the hit rate says how
often the greedy action is exactly a*_c).

The learner (:func:`run`): rlstash's DiscreteSAC (net (64,), fixed features, batch 64) on
transitions kept in an rlstash ReplayBuffer; every iteration acts on one observation of each
context (16 env steps), stores them, and takes one update. Forms:

- ``chunked``: ``DiscreteSAC.update`` (expectations over actions in chunks of 8,192, gathers);
- ``onehot``: the same networks updated by ``bench/agent_memory.py``'s dense formulation
  (one-hot actions [B, n], every expectation on full [B, n] tensors).

Memory: RSS after building agent and buffer, and the kernel's RSS high-water mark (VmHWM,
reset after one warm-up update) over the run: "peak extra" is what training added.

    from contextual import ContextualEnv, run
    out = run("chunked", n_actions=100_000, steps=4096)   # {"curve": [[step, s, return, hit]], ...}
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

SUMMARY = (
    "16 contexts (one-hot observations), 100,000 actions with fixed random unit features "
    "phi(a) in R^16; context c has one rewarding action a*_c and reward(c, a) = "
    "phi(a) . phi(a*_c) (1 at a*_c only; the best other action scores ~0.85); one-step "
    "episodes. Discrete SAC (net (64,), embedding head over the fixed features, batch 64, "
    "one update per 16 env steps) with its chunked update vs the same networks updated by "
    "the dense one-hot formulation of bench/agent_memory.py; each in a fresh process, "
    "RSS high-water (VmHWM) reset after one warm-up update."
)
N_CONTEXTS = 16
FEATURE_DIM = 16
SIZES = (100_000,)
FORMS = ("chunked", "onehot")


class ContextualEnv(gym.Env):
    """One-step episodes: observe a context (one-hot), pick one of ``n_actions`` actions."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        n_actions: int = 100_000,
        n_contexts: int = N_CONTEXTS,
        dim: int = FEATURE_DIM,
        task_seed: int = 0,
    ) -> None:
        for name, value in (("n_actions", n_actions), ("n_contexts", n_contexts), ("dim", dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if n_contexts > n_actions:
            raise ValueError(f"n_contexts: expected <= n_actions ({n_actions}), got {n_contexts}")
        rng = np.random.default_rng(task_seed)
        phi = rng.standard_normal((n_actions, dim)).astype(np.float32)  # [n, d]
        self.features = phi / np.linalg.norm(phi, axis=1, keepdims=True)  # unit rows
        self.best = rng.choice(n_actions, n_contexts, replace=False)  # a*_c, [C]
        self.n_contexts = n_contexts
        self.observation_space = gym.spaces.Box(0.0, 1.0, (n_contexts,), np.float32)
        self.action_space = gym.spaces.Discrete(n_actions)
        self._context = 0

    def reward(self, context: np.ndarray, action: np.ndarray) -> np.ndarray:
        """phi(action) . phi(a*_context), elementwise over equal-shaped int arrays."""
        return np.einsum("id,id->i", self.features[action], self.features[self.best[context]])

    def observe(self, context: np.ndarray) -> np.ndarray:
        """One-hot observations [len(context), n_contexts] float32."""
        return np.eye(self.n_contexts, dtype=np.float32)[context]

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self._context = int(self.np_random.integers(self.n_contexts))
        return self.observe(np.array([self._context]))[0], {}

    def step(self, action: Any) -> tuple:
        r = float(self.reward(np.array([self._context]), np.array([int(action)]))[0])
        obs = self.observe(np.array([self._context]))[0]
        return obs, r, True, False, {"best": int(self.best[self._context])}


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_high_water() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := current RSS
        return True
    except OSError:
        return False


def run(
    form: str,
    n_actions: int = 100_000,
    steps: int = 4096,
    seed: int = 0,
    eval_every: int = 256,
    batch_size: int = 64,
    learning_rate: float = 3e-3,
) -> dict[str, Any]:
    """Train discrete SAC for ``steps`` env steps (16 per iteration, one update each)."""
    import torch
    from agent_memory import onehot_update

    from rlstash.agents import DiscreteSAC, DiscreteSACConfig
    from rlstash.replay import ReplayBuffer
    from rlstash.spec import Field, Spec
    from rlstash.storage import TensorStorage

    if form not in FORMS:
        raise ValueError(f"form: expected one of {FORMS}, got {form!r}")
    torch.set_num_threads(1)
    env = ContextualEnv(n_actions, task_seed=seed)
    cfg = DiscreteSACConfig(
        net_arch=(64,), action_head="embedding", learn_action_embeddings=False,
        learning_rate=learning_rate, seed=seed,
    )  # fmt: skip
    agent = DiscreteSAC(
        (N_CONTEXTS,), n_actions, cfg, action_features=torch.from_numpy(env.features)
    )
    obs_f = Field((N_CONTEXTS,), torch.float32)
    spec = Spec({"obs": obs_f, "next_obs": obs_f, "action": Field((), torch.int64),
                 "reward": Field((), torch.float32), "terminated": Field((), torch.bool)})  # fmt: skip
    rb = ReplayBuffer(TensorStorage(spec, steps), seed=seed)
    update = agent.update if form == "chunked" else (lambda b: onehot_update(agent, b))
    rng = np.random.default_rng(seed)
    contexts = np.arange(N_CONTEXTS)
    all_obs = torch.from_numpy(env.observe(contexts))  # [C, C]
    rss_before = _rss_kib("VmRSS")
    curve: list[list[float]] = []
    train_s, updates, step, reset_ok = 0.0, 0, 0, True
    update_times: list[float] = []
    while step < steps:
        t0 = time.perf_counter()
        ctx = rng.permutation(contexts)  # one observation of each context, [C]
        obs = all_obs[ctx]
        action = agent.act(obs)  # [C] int64
        reward = torch.from_numpy(env.reward(ctx, action.numpy()).astype(np.float32))
        rb.extend({"obs": obs, "next_obs": obs, "action": action, "reward": reward,
                   "terminated": torch.ones(len(ctx), dtype=torch.bool)})  # fmt: skip
        step += len(ctx)
        if len(rb) >= batch_size:
            t1 = time.perf_counter()
            update(rb.sample(batch_size))
            update_times.append(time.perf_counter() - t1)
            updates += 1
            if updates == 1:
                reset_ok = _reset_high_water()  # the warm-up update allocated grads and Adam
        train_s += time.perf_counter() - t0
        if step % eval_every == 0:
            greedy = agent.act(all_obs, deterministic=True).numpy()  # [C]
            ret = float(env.reward(contexts, greedy).mean())
            hit = float((greedy == env.best).mean())
            curve.append([step, train_s, ret, hit])
    peak = _rss_kib("VmHWM")
    return {
        "form": form, "n_actions": n_actions, "steps": steps, "updates": updates,
        "curve": curve, "train_seconds": train_s,
        "s_per_update": float(np.median(update_times)) if update_times else math.nan,
        "rss_before_mib": rss_before / 1024, "peak_rss_mib": peak / 1024,
        "peak_extra_mib": (peak - rss_before) / 1024, "high_water_reset": reset_ok,
        "settings": {"net_arch": [64], "batch_size": batch_size, "learning_rate": learning_rate,
                     "feature_dim": FEATURE_DIM, "contexts": N_CONTEXTS},
    }  # fmt: skip


PPO_SUMMARY = (
    "The same task and action features; PPO (net (64, 64) tanh, embedding head over the fixed "
    "features, rollouts of 8 steps x 16 contexts = 128 rows, 4 epochs of minibatches of 64, "
    "lr 3e-3, ent_coef 0) with its chunked update (log pi(a|s) by a gather minus a chunked "
    "logsumexp, entropy streamed, chunks of 8,192 actions) vs the same networks with the dense "
    "one-hot formulation (full [B, n] logits, one_hot(a) * log_softmax summed); each in a fresh "
    "process, VmHWM reset after one warm-up update."
)


def onehot_log_prob_entropy(agent: Any) -> Callable[..., Any]:
    """The dense one-hot formulation of PPO's log pi(a|s) and entropy (comparison only)."""
    import torch
    import torch.nn.functional as F

    net, n = agent.nets["policy"], agent.n_actions

    def log_prob_entropy(x: Any, action: Any, mask: Any = None) -> tuple[Any, Any]:
        logp_all = torch.log_softmax(net.head.scores(net.embed(x)), 1)  # [B, n]
        logp = (F.one_hot(action, n).float() * logp_all).sum(1)  # [B]
        return logp, -(logp_all.exp() * logp_all).sum(1)

    return log_prob_entropy


def run_ppo(
    form: str, n_actions: int = 100_000, steps: int = 4096, seed: int = 0, eval_every: int = 256,
    learning_rate: float = 3e-3,
) -> dict[str, Any]:  # fmt: skip
    """Train PPO for ``steps`` env steps: rollouts of 8 x 16 one-step episodes, one update each."""
    import torch

    from rlstash.agents.ppo import PPO, PPOConfig
    from rlstash.spec import Spec
    from rlstash.storage.rollout import RolloutStorage

    if form not in FORMS:
        raise ValueError(f"form: expected one of {FORMS}, got {form!r}")
    torch.set_num_threads(1)
    env = ContextualEnv(n_actions, task_seed=seed)
    T, C = 8, N_CONTEXTS
    cfg = PPOConfig(
        net_arch=(64, 64), action_head="embedding", learn_action_embeddings=False,
        rollout_steps=T, minibatch_size=64, n_epochs=4, learning_rate=learning_rate, seed=seed,
        total_steps=steps,
    )  # fmt: skip
    agent = PPO((C,), n_actions, config=cfg, action_features=torch.from_numpy(env.features))
    if form == "onehot":
        agent.log_prob_entropy = onehot_log_prob_entropy(agent)
    spec = Spec({"obs": ((C,), "float32"), "action": ((), "int64")})
    rollout = RolloutStorage(spec, T, C, same_step=True)  # one-step episodes: final obs = obs
    rng = np.random.default_rng(seed)
    contexts = np.arange(C)
    all_obs = torch.from_numpy(env.observe(contexts))  # [C, C]
    rss_before = _rss_kib("VmRSS")
    curve: list[list[float]] = []
    train_s, updates, step, reset_ok = 0.0, 0, 0, True
    update_times: list[float] = []
    while step < steps:
        t0 = time.perf_counter()
        ctx = np.stack([rng.permutation(contexts) for _ in range(T)])  # [T, C]
        obs = all_obs[torch.from_numpy(ctx)]  # [T, C, C]
        action = agent.act(obs.reshape(T * C, C)).reshape(T, C)  # [T, C] int64
        reward = env.reward(ctx.reshape(-1), action.reshape(-1).numpy()).astype(np.float32)
        done = torch.ones(T, C, dtype=torch.bool)
        rollout.add({"obs": obs, "action": action, "reward": torch.from_numpy(reward).reshape(T, C),
                     "terminated": done, "truncated": ~done, "final_obs": obs}, obs[-1])  # fmt: skip
        step += T * C
        t1 = time.perf_counter()
        agent.update(rollout)
        update_times.append(time.perf_counter() - t1)
        updates += 1
        if updates == 1:
            reset_ok = _reset_high_water()  # the warm-up update allocated grads and Adam
        train_s += time.perf_counter() - t0
        if step % eval_every == 0:
            greedy = agent.act(all_obs, deterministic=True).numpy()  # [C]
            curve.append([step, train_s, float(env.reward(contexts, greedy).mean()),
                          float((greedy == env.best).mean())])  # fmt: skip
    peak = _rss_kib("VmHWM")
    return {
        "form": form, "n_actions": n_actions, "steps": steps, "updates": updates,
        "curve": curve, "train_seconds": train_s,
        "s_per_update": float(np.median(update_times)) if update_times else math.nan,
        "rss_before_mib": rss_before / 1024, "peak_rss_mib": peak / 1024,
        "peak_extra_mib": (peak - rss_before) / 1024, "high_water_reset": reset_ok,
        "settings": {"net_arch": [64, 64], "rollout": [T, C], "minibatch_size": 64,
                     "n_epochs": 4, "learning_rate": learning_rate},
    }  # fmt: skip


def benchmark(
    spawn: Callable[[dict], dict], steps: int = 4096, seed: int = 0, part: str = "contextual"
) -> dict:
    """Each (size, form) in a fresh process via ``spawn``; results keyed "n/form".
    ``part``: "contextual" (discrete SAC, :func:`run`) or "ppo_contextual" (:func:`run_ppo`)."""
    out: dict[str, Any] = {}
    for n in SIZES:
        for form in FORMS:
            task = {"part": part, "args": {"form": form, "n_actions": n, "steps": steps,
                                           "seed": seed}}  # fmt: skip
            start = time.time()
            res = spawn(task)
            out[f"{n}/{form}"] = res
            last = res.get("curve", [[0, 0, math.nan, math.nan]])[-1]
            print(f"{part} {n} {form}: {res.get('error', '')} return {last[2]:.3f} "
                  f"hit {last[3]:.2f} peak extra {res.get('peak_extra_mib', math.nan):.0f} MiB "
                  f"({time.time() - start:.0f} s)", flush=True)  # fmt: skip
    return out
