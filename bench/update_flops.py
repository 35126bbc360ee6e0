"""Agent update rates as a fraction of their networks' compute limit (part ``updates`` of
bench/learn.py; run in a worker process with one torch thread).

FLOPs per update are counted from the layer shapes: a dense layer in -> out on B rows costs
2 B in out forward, 2 B in out more for the gradient of its input and 2 B in out for the
gradient of its weights. Per algorithm (P = sum of in * out over a network's layers; a = actor,
c = one critic, q = the Q-network; each library's own algorithm, counting only the passes it
needs):

- DQN, double (rlstash): online Q on s forward + backward (6 B Pq), online and target Q on s'
  forward (4 B Pq): 10 B Pq. DQN as in SB3 (max over the target): 8 B Pq.
- SAC: actor on s forward + backward (6 B Pa), on s' forward (2 B Pa); target critics on s'
  (2 x 2 B Pc); critics on (s, a_b) forward + backward (2 x 6 B Pc); critics on (s, pi(s)),
  forward and input gradient (2 x 4 B Pc): B (8 Pa + 24 Pc).
- TD3 (delay d): target actor on s' (2 B Pa), target critics (4 B Pc), critics forward +
  backward (12 B Pc) every update; every d-th update the actor forward + backward (6 B Pa) and
  Q_1 forward + input gradient (4 B Pc): B (2 Pa + 16 Pc + (6 Pa + 4 Pc) / d).

Elementwise work, the optimizer and sampling are not counted: the limit is what the matmuls
alone would take at the machine's matmul rate, measured in the same process (float32
512 x 512 by 512 x 512, one thread). fraction = updates/s x FLOPs/update / matmul FLOP/s.

An update here is one gradient step including drawing its batch from a replay buffer of
10,000 random transitions (rlstash: ``ReplayBuffer`` over a ``TensorStorage``; SB3: its own
buffer, through ``model.train(gradient_steps=n)``). rlstash, SB3 and the matmul are timed
interleaved (common.interleaved), medians of 5 repetitions.
"""

from __future__ import annotations

from typing import Any

ROWS = 10_000  # random transitions in each replay buffer
MATMUL_N = 512

# name -> the task's shapes and each side's network and batch
CONFIGS: dict[str, dict[str, Any]] = {
    "dqn_preset": {"algo": "dqn", "env": "CartPole-v1", "obs": 4, "act": 2,
                   "rlstash": {"net": (64, 64), "batch": 64},
                   "sb3": {"net": (256, 256), "batch": 64}},
    "dqn_same": {"algo": "dqn", "env": "CartPole-v1", "obs": 4, "act": 2,
                 "rlstash": {"net": (256, 256), "batch": 64},
                 "sb3": {"net": (256, 256), "batch": 64}},
    "sac_preset": {"algo": "sac", "env": "Pendulum-v1", "obs": 3, "act": 1,
                   "rlstash": {"net": (64, 64), "batch": 256},
                   "sb3": {"net": (256, 256), "batch": 256}},
    "sac_same": {"algo": "sac", "env": "HalfCheetah-v5", "obs": 17, "act": 6,
                 "rlstash": {"net": (256, 256), "batch": 256},
                 "sb3": {"net": (256, 256), "batch": 256}},
    "td3_preset": {"algo": "td3", "env": "Pendulum-v1", "obs": 3, "act": 1,
                   "rlstash": {"net": (64, 64), "batch": 256},
                   "sb3": {"net": (400, 300), "batch": 256}},
}  # fmt: skip


def macs(dims: list[int]) -> int:
    """sum of in * out over the dense layers dims[0] -> dims[1] -> ... -> dims[-1]."""
    return sum(a * b for a, b in zip(dims[:-1], dims[1:]))


def flops_per_update(
    algo: str, obs: int, act: int, net: tuple[int, ...], batch: int, lib: str, delay: int = 2
) -> float:
    """FLOPs of one update's matmuls (module docstring); ``act`` = actions (DQN) or act_dim."""
    if algo == "dqn":
        pq = macs([obs, *net, act])
        return (10 if lib == "rlstash" else 8) * batch * pq
    if algo == "sac":
        pa, pc = macs([obs, *net, 2 * act]), macs([obs + act, *net, 1])
        return batch * (8 * pa + 24 * pc)
    if algo == "td3":
        pa, pc = macs([obs, *net, act]), macs([obs + act, *net, 1])
        return batch * (2 * pa + 16 * pc + (6 * pa + 4 * pc) / delay)
    raise ValueError(f"algo: expected dqn, sac or td3, got {algo!r}")


def _rlstash_update(cfg: dict[str, Any]) -> Any:
    import torch

    from rlstash import ReplayBuffer, TensorStorage
    from rlstash.agents.dqn import DQN, DQNConfig
    from rlstash.agents.sac import SAC, SACConfig
    from rlstash.agents.td3 import TD3, TD3Config

    algo, obs, act = cfg["algo"], cfg["obs"], cfg["act"]
    net, batch = cfg["rlstash"]["net"], cfg["rlstash"]["batch"]
    g = torch.Generator().manual_seed(0)
    data = {
        "obs": torch.randn(ROWS, obs, generator=g),
        "next_obs": torch.randn(ROWS, obs, generator=g),
        "reward": torch.randn(ROWS, generator=g),
        "terminated": torch.rand(ROWS, generator=g) < 0.05,
    }
    if algo == "dqn":
        agent: Any = DQN((obs,), act, DQNConfig(net_arch=net))
        data["action"] = torch.randint(0, act, (ROWS,), generator=g)
    else:
        data["action"] = 2 * torch.rand(ROWS, act, generator=g) - 1
        if algo == "sac":
            agent = SAC((obs,), act, -1.0, 1.0, SACConfig(net_arch=net))
        else:
            agent = TD3((obs,), act, -1.0, 1.0, TD3Config(net_arch=net))
    spec = {k: (tuple(v.shape[1:]), v.dtype) for k, v in data.items()}
    rb = ReplayBuffer(TensorStorage(spec, ROWS), seed=0)
    rb.extend(data)

    def run(n: int) -> None:
        for _ in range(n):
            agent.update(rb.sample(batch))

    return run


def _sb3_update(cfg: dict[str, Any]) -> Any:
    import gymnasium as gym
    import numpy as np
    from stable_baselines3 import DQN, SAC, TD3
    from stable_baselines3.common.logger import configure

    algo, net, batch = cfg["algo"], list(cfg["sb3"]["net"]), cfg["sb3"]["batch"]
    env = gym.make(cfg["env"])
    cls = {"dqn": DQN, "sac": SAC, "td3": TD3}[algo]
    model = cls("MlpPolicy", env, policy_kwargs={"net_arch": net}, batch_size=batch,
                learning_starts=0, buffer_size=ROWS, device="cpu", seed=0)  # fmt: skip
    model.set_logger(configure(None, []))
    rng = np.random.default_rng(0)
    space = env.action_space
    for _ in range(ROWS):
        o, o2 = rng.standard_normal((2, 1, *env.observation_space.shape)).astype(np.float32)
        a = np.array([[space.sample()]]) if algo == "dqn" else rng.uniform(-1, 1, (1, *space.shape))
        done = np.array([rng.random() < 0.05])
        model.replay_buffer.add(o, o2, a, np.array([rng.standard_normal()]), done, [{}])

    def run(n: int) -> None:
        model.train(gradient_steps=n, batch_size=batch)

    return run


def _matmul() -> Any:
    import torch

    a, b = torch.randn(MATMUL_N, MATMUL_N), torch.randn(MATMUL_N, MATMUL_N)
    out = torch.empty(MATMUL_N, MATMUL_N)

    def run(n: int) -> None:
        for _ in range(n):
            torch.mm(a, b, out=out)

    return run


def measure(name: str) -> dict[str, Any]:
    """Updates/s of rlstash and SB3 and the matmul FLOP/s, interleaved; FLOP fractions."""
    from common import interleaved

    cfg = CONFIGS[name]
    runs = {"rlstash": _rlstash_update(cfg), "sb3": _sb3_update(cfg), "matmul": _matmul()}
    timings = interleaved(runs, reps=5, target_s=0.5)
    peak = timings["matmul"].median * 2 * MATMUL_N**3
    out: dict[str, Any] = {"matmul_flops": peak, "algo": cfg["algo"], "env": cfg["env"]}
    for lib in ("rlstash", "sb3"):
        side = cfg[lib]
        flops = flops_per_update(
            cfg["algo"], cfg["obs"], cfg["act"], side["net"], side["batch"], lib
        )
        rate = timings[lib].median
        out[lib] = {"net": list(side["net"]), "batch": side["batch"], "flops": flops,
                    "updates_per_s": rate, "spread": timings[lib].spread,
                    "limit_per_s": peak / flops, "fraction": rate * flops / peak}  # fmt: skip
    return out


def section(results: dict[str, Any]) -> list[str]:
    """The markdown section of the ``updates`` part."""
    from common import markdown_table

    doc = __doc__.split("\n\n")
    lines = ["## Update rates against the compute limit", ""]
    lines += [x for para in doc[1:5] for x in (para.replace("``", "`"), "")]
    rows = []
    for name, r in results.items():
        if "error" in r:
            rows.append([name, r["error"], *[""] * 7])
            continue
        for lib in ("rlstash", "sb3"):
            s = r[lib]
            rows.append([name, lib, f"{tuple(s['net'])}", s["batch"], f"{s['flops'] / 1e6:.1f}",
                         f"{s['updates_per_s']:.0f}", f"{s['limit_per_s']:.0f}",
                         f"{s['fraction']:.2f}", f"{r['matmul_flops'] / 1e9:.0f}"])  # fmt: skip
    headers = ["config", "library", "net", "batch", "MFLOP/update", "updates/s",
               "limit updates/s", "fraction of limit", "matmul GFLOP/s"]  # fmt: skip
    return lines + [markdown_table(headers, rows), ""]
