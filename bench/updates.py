"""Agent update rates against the compute limit (issue 15): rlstash eager, rlstash compiled
(``config.compile=True``), Stable-Baselines3, and a minimal CleanRL-style update written here
as the eager reference; DQN, SAC, discrete SAC, TD3 and PPO with (64, 64) and (256, 256) MLPs,
batch 256, one torch thread, CPU.

    python bench/updates.py                    # every config, one child process each
    python bench/updates.py --only sac-256     # one config (prints its JSON)
    python bench/updates.py --device cuda --out OUT.md   # the GPU table (module gpu part)

FLOPs per update are counted from the layer shapes: a dense layer in -> out on B rows costs
2 B in out forward, 2 B in out more for the gradient of its input and 2 B in out for the
gradient of its weights. Per algorithm (P = sum of in * out over a network's layers; a = actor,
c = one critic, q = a Q-network, v = the value network; the passes the algorithm needs):

- DQN, double (rlstash): online Q on s forward + backward (6 B Pq), online and target Q on s'
  forward (4 B Pq): 10 B Pq. DQN as in SB3 and CleanRL (max over the target): 8 B Pq.
- SAC: actor on s forward + backward (6 B Pa), on s' forward (2 B Pa); target critics on s'
  (2 x 2 B Pc); critics on (s, a_b) forward + backward (2 x 6 B Pc); critics on (s, pi(s)),
  forward and input gradient (2 x 4 B Pc): B (8 Pa + 24 Pc).
- Discrete SAC: actor on s' forward (2 B Pa) and on s forward + backward (6 B Pa); target Qs
  on s' (4 B Pq); Qs on s forward + backward (12 B Pq) and forward again after their step
  (4 B Pq): B (8 Pa + 20 Pq).
- TD3 (delay 2): target actor on s' (2 B Pa), target critics (4 B Pc), critics forward +
  backward (12 B Pc) every update; every 2nd update the actor forward + backward (6 B Pa) and
  Q_1 forward + input gradient (4 B Pc): B (2 Pa + 16 Pc + (6 Pa + 4 Pc) / 2).
- PPO, one minibatch step: policy and value networks forward + backward: 6 B (Pa + Pv).

Elementwise work, the optimizer and sampling are not counted: the limit is what the matmuls
alone would take at the machine's matmul rate, measured in the same process (float32
512 x 512 by 512 x 512, one thread). fraction = updates/s x FLOPs/update / matmul FLOP/s.

An off-policy update is one gradient step including drawing its batch of 256 from 10,000
random transitions (rlstash: ``ReplayBuffer`` over a ``TensorStorage``; SB3: its own buffer,
through ``model.train(gradient_steps=n)``; CleanRL-style: an index gather from tensors). A PPO
update is one minibatch step on 256 of 512 prepared rows (rlstash: ``PPO._minibatch``; SB3:
``model.train()`` with one epoch per 2 minibatches; CleanRL-style: its minibatch loop body).
The four sides and the matmul are timed interleaved (common.interleaved), medians of 5
repetitions; the compiled side's compilation happens before timing and is reported apart.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import updates_refs as refs

ROWS = 10_000  # random transitions in each replay buffer
BATCH = 256
MATMUL_N = 512
PPO_ROWS = 512
NETS = {"64": (64, 64), "256": (256, 256)}
TASKS = {  # algo -> (obs dim, actions (discrete) or act_dim)
    "dqn": (4, 2),
    "sac": (17, 6),
    "sac_discrete": (4, 2),
    "td3": (17, 6),
    "ppo": (4, 2),
}
CONFIGS = {f"{algo}-{size}": (algo, NETS[size]) for algo in TASKS for size in NETS}
SIDES = ("rlstash", "rlstash compiled", "SB3", "CleanRL-style")
OUT = Path(__file__).parent / "results" / "updates.md"


def macs(dims: list[int]) -> int:
    """sum of in * out over the dense layers dims[0] -> dims[1] -> ... -> dims[-1]."""
    return sum(a * b for a, b in zip(dims[:-1], dims[1:]))


def flops_per_update(
    algo: str, net: tuple[int, ...], side: str, dims: tuple[int, int] | None = None
) -> float:
    """FLOPs of one update's matmuls (module docstring); ``dims``: (obs dim, actions or
    act_dim) of another env than the benchmark's."""
    obs, act = dims or TASKS[algo]
    b = BATCH
    if algo == "dqn":
        return (10 if side.startswith("rlstash") else 8) * b * macs([obs, *net, act])
    if algo == "sac":
        pa, pc = macs([obs, *net, 2 * act]), macs([obs + act, *net, 1])
        return b * (8 * pa + 24 * pc)
    if algo == "sac_discrete":
        pa = pq = macs([obs, *net, act])
        return b * (8 * pa + 20 * pq)
    if algo == "td3":
        pa, pc = macs([obs, *net, act]), macs([obs + act, *net, 1])
        return b * (2 * pa + 16 * pc + (6 * pa + 4 * pc) / 2)
    if algo == "ppo":
        return 6 * b * (macs([obs, *net, act]) + macs([obs, *net, 1]))
    raise ValueError(f"algo: expected one of {sorted(TASKS)}, got {algo!r}")


def _transitions(algo: str) -> dict[str, Any]:
    import torch

    obs, act = TASKS[algo]
    g = torch.Generator().manual_seed(0)
    data = {
        "obs": torch.randn(ROWS, obs, generator=g),
        "next_obs": torch.randn(ROWS, obs, generator=g),
        "reward": torch.randn(ROWS, generator=g),
        "terminated": torch.rand(ROWS, generator=g) < 0.05,
    }
    if algo in ("dqn", "sac_discrete"):
        data["action"] = torch.randint(0, act, (ROWS,), generator=g)
    else:
        data["action"] = 2 * torch.rand(ROWS, act, generator=g) - 1
    return data


def _rlstash(
    algo: str, net: tuple[int, ...], compile: bool, device: str = "cpu", graphs: bool = True
) -> Any:
    """run(n): n rlstash updates on ``device``; the first (compiling) calls are made here.
    ``graphs=False``: compiled steps are not captured into CUDA graphs (inductor only)."""
    import torch

    from rlstash import ReplayBuffer, TensorStorage
    from rlstash.agents import dqn, ppo, sac, sac_discrete, td3

    obs, act = TASKS[algo]
    if algo == "ppo":
        cfg_ppo = ppo.PPOConfig(net_arch=net, compile=compile)
        agent = ppo.PPO((obs,), act, config=cfg_ppo, device=device)
        data = agent.prepare(refs.ppo_rollout(PPO_ROWS, obs, act))
        g = torch.Generator().manual_seed(1)
        idx = [torch.randperm(PPO_ROWS, generator=g)[:BATCH].to(device) for _ in range(8)]
        clip = agent.config.clip_range
        agent.clip_now.fill_(clip)

        def run(n: int) -> None:
            for i in range(n):
                agent._minibatch(data, idx[i % 8], clip)

    else:
        if algo == "dqn":
            cfg: Any = dqn.DQNConfig(net_arch=net, compile=compile)
            agent: Any = dqn.DQN((obs,), act, cfg, device=device)
        elif algo == "sac_discrete":
            cfg = sac_discrete.DiscreteSACConfig(net_arch=net, compile=compile)
            agent = sac_discrete.DiscreteSAC((obs,), act, cfg, device=device)
        elif algo == "sac":
            cfg = sac.SACConfig(net_arch=net, compile=compile)
            agent = sac.SAC((obs,), act, -1.0, 1.0, cfg, device=device)
        else:
            cfg = td3.TD3Config(net_arch=net, compile=compile)
            agent = td3.TD3((obs,), act, -1.0, 1.0, cfg, device=device)
        data = _transitions(algo)
        spec = {k: (tuple(v.shape[1:]), v.dtype) for k, v in data.items()}
        rb = ReplayBuffer(TensorStorage(spec, ROWS, device=device), seed=0)
        rb.extend(data)

        def run(n: int) -> None:
            for _ in range(n):
                agent.update(rb.sample(BATCH))

    # compiles every step (TD3's actor step on the 2nd update); on CUDA a graphed step warms
    # up twice and is captured on its 3rd call (TD3's actor: the 6th update)
    from rlstash.agents import compiled

    graphed = compile and graphs and torch.device(device).type in compiled.GRAPH_DEVICES
    warm = 8 if graphed else 2
    start = time.perf_counter()
    with graph_devices(graphs):
        run(warm)
    sync(device)
    run.first_s = time.perf_counter() - start  # type: ignore[attr-defined]
    run.compile_s = getattr(agent, "compile_seconds", 0.0)  # type: ignore[attr-defined]
    run.steps = sorted({type(s).__name__ for s in agent._steps.values()})  # type: ignore[attr-defined]
    if compile and torch.device(device).type == "cuda":
        want = ["GraphedStep"] if graphs else ["CompiledStep"]
        if run.steps != want:  # type: ignore[attr-defined]
            raise RuntimeError(f"compiled steps: expected {want}, got {run.steps}")  # type: ignore[attr-defined]
    return run


@contextlib.contextmanager
def graph_devices(enabled: bool) -> Iterator[None]:
    """Steps built inside are CUDA-graphed on CUDA (``enabled``, rlstash's default) or only
    compiled (``rlstash.agents.compiled.GRAPH_DEVICES = ()``; read when a step is built)."""
    from rlstash.agents import compiled

    saved = compiled.GRAPH_DEVICES
    if not enabled:
        compiled.GRAPH_DEVICES = ()
    try:
        yield
    finally:
        compiled.GRAPH_DEVICES = saved


def sync(device: str) -> None:
    """torch.cuda.synchronize() on CUDA (a timing edge), nothing on CPU."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def synced(run: Any, device: str) -> Any:
    """``run`` ending in a device synchronization (every timed call does, so both edges of a
    timing are synchronized); its attributes kept."""
    if device == "cpu":
        return run

    def call(n: int) -> None:
        run(n)
        sync(device)

    call.__dict__.update(run.__dict__)
    return call


def matmul_flops(seconds: float = 1.0) -> float:
    """This process's matmul FLOP/s now (the 512 x 512 product of ``_matmul``, ~``seconds``)."""
    run, n, start = _matmul(), 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        run(8)
        n += 8
    return n * 2 * MATMUL_N**3 / elapsed


def _matmul(device: str = "cpu", size: int = MATMUL_N) -> Any:
    import torch

    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    out = torch.empty(size, size, device=device)

    def run(n: int) -> None:
        for _ in range(n):
            torch.mm(a, b, out=out)

    return run


def measure(name: str, reps: int = 5, target_s: float = 0.5) -> dict[str, Any]:
    """Updates/s of every side and the matmul FLOP/s, interleaved; FLOP fractions."""
    import torch
    from common import interleaved

    torch.set_num_threads(1)
    algo, net = CONFIGS[name]
    runs: dict[str, Any] = {"matmul": _matmul()}
    out: dict[str, Any] = {"algo": algo, "net": list(net), "batch": BATCH, "sides": {}}
    makers = {
        "rlstash": lambda: _rlstash(algo, net, False),
        "rlstash compiled": lambda: _rlstash(algo, net, True),
        "SB3": lambda: refs.sb3_update(algo, net, TASKS[algo], BATCH, ROWS, PPO_ROWS),
        "CleanRL-style": lambda: refs.cleanrl_update(algo, net, TASKS[algo], BATCH, ROWS, PPO_ROWS),
    }
    for side, make in makers.items():
        try:
            run = make()
        except Exception as exc:  # noqa: BLE001 - a peer that cannot run this config
            out["sides"][side] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        if run is not None:
            runs[side] = run
            out["sides"][side] = {"compile_s": getattr(run, "compile_s", 0.0)}
        else:
            out["sides"][side] = {"error": "n/a (no such algorithm)"}
    timings = interleaved(runs, reps=reps, target_s=target_s)
    peak = timings["matmul"].median * 2 * MATMUL_N**3
    out["matmul_flops"] = peak
    for side in runs:
        if side == "matmul":
            continue
        flops = flops_per_update(algo, net, side)
        rate = timings[side].median
        out["sides"][side].update(flops=flops, updates_per_s=rate, spread=timings[side].spread,
                                  limit_per_s=peak / flops, fraction=rate * flops / peak)  # fmt: skip
    return out


def section(results: dict[str, Any]) -> list[str]:
    """The markdown section: one row per config and side."""
    from common import markdown_table

    rows = []
    for name, r in results.items():
        if "error" in r or "sides" not in r:
            rows.append([name, r.get("error", "an earlier format: rerun"), *[""] * 8])
            continue
        sb3 = r["sides"].get("SB3", {}).get("updates_per_s")
        for side in SIDES:
            s = r["sides"].get(side, {})
            if "updates_per_s" not in s:
                rows.append([name, side, "", "", "", "", "", s.get("error", ""), "", ""])
                continue
            vs_sb3 = f"{s['updates_per_s'] / sb3:.2f}" if sb3 else "—"
            compile_s = f"{s['compile_s']:.0f}" if s.get("compile_s") else ""
            rows.append([name, side, f"{s['flops'] / 1e6:.1f}", f"{s['updates_per_s']:.0f}",
                         f"{s['limit_per_s']:.0f}", f"{s['fraction']:.2f}", vs_sb3,
                         f"{s['spread']:.2f}", compile_s, f"{r['matmul_flops'] / 1e9:.0f}"])  # fmt: skip
    headers = ["config", "side", "MFLOP/update", "updates/s", "limit updates/s",
               "fraction of limit", "x SB3", "spread", "compile s", "matmul GFLOP/s"]  # fmt: skip
    return ["## Update rates against the compute limit", "", markdown_table(headers, rows), ""]


def _child(name: str) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, __file__, "--only", name, "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        return {"error": f"child failed: {done.stderr.strip().splitlines()[-1:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    from common import header_lines, machine_info, publish

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=sorted(CONFIGS), help="one config")
    parser.add_argument("--json", action="store_true", help="print the JSON result only")
    parser.add_argument("--out", default=None, help="markdown report path")
    parser.add_argument("--device", default="cpu", help="cpu (the peers' table) or cuda: "
                        "rlstash eager, compiled and compiled + CUDA graphs (bench/updates_gpu.py)")  # fmt: skip
    parser.add_argument("--three-way", action="store_true",
                        help="the GPU table's sides on --device cpu (a check of that code)")  # fmt: skip
    parser.add_argument("--configs", default="", help="GPU table: comma-separated configs")
    parser.add_argument("--barrier", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compile-timeout", type=float, default=180.0,
                        help="GPU table: seconds for all configs to compile (in parallel)")  # fmt: skip
    parser.add_argument("--measure-timeout", type=float, default=60.0,
                        help="GPU table: seconds for one config's timing")  # fmt: skip
    parser.add_argument("--budget", type=float, default=300.0,
                        help="GPU table: seconds for everything (no wait goes past it)")  # fmt: skip
    args = parser.parse_args()
    if args.device != "cpu" or args.three_way:
        import updates_gpu

        if args.only:
            return updates_gpu.child(args.only, args.device, args.barrier)
        args.out = args.out or str(OUT.with_name(f"updates_{args.device}.md"))
        return updates_gpu.main(__file__, args)
    args.out = args.out or str(OUT)
    if args.only:
        result = measure(args.only)
        print(json.dumps(result) if args.json else json.dumps(result, indent=1))
        return 0
    info = machine_info()
    results = {}
    for name in CONFIGS:
        results[name] = _child(name)
        print(f"[updates] {name}: {json.dumps(results[name])}", flush=True)
    info["load_average_1m_end"] = round(os.getloadavg()[0], 2)
    doc = __doc__.split("\n\n")
    lines = [
        "# Agent updates: rlstash eager and compiled, SB3, CleanRL-style",
        "",
        *header_lines(info),
        "",
    ]
    lines += [x for para in doc[2:] for x in (para.replace("``", "`"), "")]
    lines += section(results)
    Path(args.out).with_suffix(".json").write_text(json.dumps(results, indent=1))
    failed = [n for n, r in results.items() if "error" in r]
    return publish("\n".join(lines), args.out, "updates", failed)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    raise SystemExit(main())
