"""End-to-end rlstash training on a MuJoCo env, compiled + CUDA graphs and eager, against
LeanRL's published H100 figures (issue 28).

    python bench/gpu_e2e.py --device cuda --out OUT.md          # SAC, TD3, PPO; both modes
    python bench/gpu_e2e.py --device cpu --learning-starts 300 --measure-steps 200 \\
        --ppo-rollout 256 --out /tmp/e2e.md                       # a smoke run of the code

Each run is the loop of ``rlstash train`` built by its Python API
(:func:`rlstash.train.build_run`, then the run's ``Learning.iterate``: collect, extend,
sample, update; on-policy: collect a rollout, update) in a fresh process, without the 1 s
progress rows, evaluations and checkpoints of ``drive`` around it. Settings are LeanRL's
(``leanrl/{sac,td3,ppo}_continuous_action_torchcompile.py``, pytorch-labs/LeanRL): 1 env
(gymnasium ``HalfCheetah-v4``, as LeanRL), in-process; SAC and TD3: batch 256, a 1e6 replay on
the learner's device, (256, 256) ReLU networks, one update per env step from
``learning_starts`` (SAC 5,000, TD3 25,000: uniform random actions until then), gamma 0.99,
tau 0.005; SAC: autotuned alpha from 1, log std in [-5, 2], one learning rate 3e-4 (LeanRL:
3e-4 for the actor, 1e-3 for critics and alpha: a rate, not a cost), the actor every update
(LeanRL: two actor steps every second update: the same count); TD3: learning rate 3e-4, policy
delay 2, target noise 0.2 clipped at 0.5, exploration noise 0.1. PPO: rollouts of 2,048 steps,
10 epochs of 32 minibatches of 64, (64, 64) tanh networks with orthogonal init, lr 3e-4
annealed over 1M steps, Adam eps 1e-5, clip 0.2 on the ratio and the value, GAE 0.99/0.95,
gradient norm 0.5, normalized observations and rewards (clip 10), value coefficient 0.25
(CleanRL's 0.5 x its 0.5-scaled value loss).

compiled = ``compile=True`` (on CUDA every update step and the acting step compiled with
inductor and captured into a CUDA graph); eager = ``compile=False``. The rate is env steps/s
measured after learning starts, as LeanRL does (its ``measure_burnin``): off-policy from
``learning_starts + warm-up`` env steps (the first updates compile and capture the steps, the
warm-up excludes them) to the end; PPO over the rollouts after the first (whose update
compiles). "Before learning": the second half of the steps before ``learning_starts`` (past
the acting step's compilation). Both edges are ``torch.cuda.synchronize()``d. LeanRL's figures are its own (its
README, an H100, its host CPU); ours run on this machine's GPU and CPU: the ratio compares
whole loops (env, collection, replay, updates) on different hosts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LEANRL = {"sac": 725.0, "td3": 936.0, "ppo": 1774.0}  # env steps/s, compile + cudagraphs, H100
OUT = Path(__file__).parent / "results" / "gpu_e2e.md"
OFF_POLICY = dict(batch_size=256, buffer_size=1_000_000, train_freq=1, gradient_steps=1, n_steps=1)
AGENT = {
    "sac": dict(learning_rate=3e-4, gamma=0.99, tau=0.005, target_update_interval=1,
                init_alpha=1.0, autotune_alpha=True, log_std_min=-5.0, log_std_max=2.0,
                net_arch=(256, 256)),
    "td3": dict(learning_rate=3e-4, gamma=0.99, tau=0.005, policy_delay=2,
                target_policy_noise=0.2, target_noise_clip=0.5, exploration_noise=0.1,
                net_arch=(256, 256)),
    "ppo": dict(num_envs=1, rollout_steps=2048, minibatch_size=64, n_epochs=10,
                learning_rate=3e-4, anneal_lr=True, gamma=0.99, gae_lambda=0.95,
                clip_range=0.2, clip_range_vf=0.2, normalize_advantage=True, ent_coef=0.0,
                vf_coef=0.25, max_grad_norm=0.5, norm_obs=True, norm_reward=True,
                clip_obs=10.0, clip_reward=10.0, net_arch=(64, 64), activation="tanh",
                ortho_init=True, log_std_init=0.0, bound="clip", adam_eps=1e-5,
                total_steps=1_000_000),
}  # fmt: skip
LEARNING_STARTS = {"sac": 5000, "td3": 25000}
MODES = {"compiled": True, "eager": False}


def train_config(task: dict[str, Any], run_dir: str) -> Any:
    """The TrainConfig of one run (module docstring)."""
    from rlstash.train import TrainConfig

    algo = task["algo"]
    agent: dict[str, Any] = dict(AGENT[algo], compile=MODES[task["mode"]])
    loop: dict[str, Any] = {}
    if algo == "ppo":
        agent["rollout_steps"] = task["rollout"]
        steps = task["rollout"] * (1 + task["rollouts"])
    else:
        starts = task["learning_starts"]
        loop = dict(OFF_POLICY, learning_starts=starts, buffer_device=task["device"])
        if algo == "td3":
            agent["random_steps"] = starts
        steps = starts + task["warm"] + task["measure"]
    big = 10 * steps  # no evaluation, no checkpoint inside the run
    return TrainConfig(
        algo=algo, env=task["env"], steps=steps, seed=task["seed"], envs=1, workers=0,
        device=task["device"], eval_every=big, checkpoint_every=big, run_dir=run_dir,
        name=f"{algo}-{task['mode']}", quiet=True, agent=agent, **loop,
    )  # fmt: skip


def worker(task: dict[str, Any]) -> dict[str, Any]:
    """One run; env steps/s before learning, after learning starts (the measured window)."""
    import torch

    from rlstash.train import build_run

    device = task["device"]

    def sync() -> None:
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()

    algo = task["algo"]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = train_config(task, tmp)
        t_build = time.perf_counter()
        run = build_run(cfg, Path(tmp) / cfg.run_name)
        try:
            build_s = time.perf_counter() - t_build
            iterate = run.learning.iterate(run)
            if algo == "ppo":
                start_at = task["rollout"]  # after the first rollout and its (compiling) update
            else:
                start_at = task["learning_starts"] + task["warm"]
            total = run.cfg.steps
            metrics: dict[str, Any] = {}
            begin = time.perf_counter()
            t0 = s0 = None
            first_update_s = None
            pre: tuple[int, float] = (0, 0.0)  # env steps before learning, their seconds
            half: tuple[int, float] | None = None
            last_note = begin
            while run.step < total:
                before, step_before = run.agent.updates, run.step
                t = time.perf_counter()
                metrics = iterate(metrics)
                if half is None and run.step >= task.get("learning_starts", 0) // 2:
                    half = (run.step, time.perf_counter())  # past the acting step's compile
                if first_update_s is None and run.agent.updates > before:
                    sync()
                    first_update_s = time.perf_counter() - t
                    if half is not None and step_before > half[0]:  # the 2nd half's rate
                        pre = (step_before - half[0], t - half[1])
                if t0 is None and run.step >= start_at:
                    sync()
                    t0, s0 = time.perf_counter(), run.step
                if time.perf_counter() - last_note > 5:
                    last_note = time.perf_counter()
                    print(f"[gpu_e2e] {algo} {task['mode']}: step {run.step}/{total} "
                          f"({last_note - begin:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
            sync()
            t1 = time.perf_counter()
            if t0 is None or s0 is None or run.step <= s0:
                raise RuntimeError(f"no steps measured (start {start_at}, end {run.step})")
            finite = bool(
                torch.isfinite(torch.as_tensor([float(v) for v in _scalars(metrics)])).all()
            )
            return {
                "algo": algo, "mode": task["mode"], "device": device, "env": task["env"],
                "steps_per_s": (run.step - s0) / (t1 - t0), "measured_steps": run.step - s0,
                "measured_s": t1 - t0, "pre_learning_steps_per_s": pre[0] / pre[1] if pre[0] else None,
                "first_update_s": first_update_s, "compile_s": run.agent.compile_seconds,
                "updates": run.agent.updates, "build_s": build_s, "metrics_finite": finite,
                "return_recent": float(run.collector.stats.mean_return()),
                "steps": [type(s).__name__ for s in run.agent._steps.values()],
                "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else "",
            }  # fmt: skip
        finally:
            run.close()


def _scalars(metrics: dict[str, Any]) -> list[float]:
    import torch

    out = []
    for v in metrics.values():
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            out.append(float(v))
        elif isinstance(v, int | float):
            out.append(float(v))
    return out


def _spawn(task: dict[str, Any], timeout: float) -> dict[str, Any]:
    """``worker(task)`` in a fresh process (stderr passes through: progress), its JSON."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(task)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    try:
        out, _ = proc.communicate(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=30)
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = out.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": f"exit code {proc.returncode} (its traceback is above in stderr)"}
    return json.loads(lines[-1])


def section(results: list[dict[str, Any]], device: str) -> list[str]:
    """The markdown table."""
    from common import markdown_table

    rows = []
    for r in results:
        algo, mode = r["task"]["algo"], r["task"]["mode"]
        if "steps_per_s" not in r:
            rows.append([algo, mode, r.get("error", "?"), *[""] * 8])
            continue
        anchor = LEANRL[algo] if mode == "compiled" else None
        rows.append([algo, mode, f"{r['steps_per_s']:.0f}",
                     f"{r['steps_per_s'] / anchor:.2f}" if anchor else "—",
                     f"{anchor:.0f}" if anchor else "—", f"{r['measured_steps']}",
                     _num(r["pre_learning_steps_per_s"]), f"{r['first_update_s']:.1f}",
                     f"{r['compile_s']:.1f}" if r["compile_s"] else "",
                     f"{r['updates']}", "yes" if r["metrics_finite"] else "NO"])  # fmt: skip
    headers = ["algo", "mode", "env steps/s after learning starts", "x LeanRL",
               "LeanRL H100 (compile + cudagraphs)", "steps measured",
               "env steps/s before learning", "first learning iteration s", "compile s", "updates",
               "metrics finite"]  # fmt: skip
    return [f"## End to end on {device}", "", markdown_table(headers, rows), ""]


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.0f}"


def main() -> int:
    from common import header_lines, machine_info, publish

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cuda", help="learner (and replay) device")
    parser.add_argument("--out", default=str(OUT), help="markdown report path")
    parser.add_argument("--algos", default="sac,td3,ppo", help="comma-separated")
    parser.add_argument("--modes", default="compiled,eager", help="comma-separated")
    parser.add_argument("--env", default="", help="default HalfCheetah-v4 (else -v5)")
    parser.add_argument("--learning-starts", type=int, default=0,
                        help="override LeanRL's (SAC 5,000, TD3 25,000): a smoke run")  # fmt: skip
    parser.add_argument("--warm", type=int, default=100, help="env steps after learning starts "
                        "before the measured window (compilation, capture)")  # fmt: skip
    parser.add_argument(
        "--measure-steps", type=int, default=2000, help="off-policy env steps timed"
    )
    parser.add_argument("--ppo-rollout", type=int, default=2048, help="PPO steps per rollout")
    parser.add_argument("--ppo-rollouts", type=int, default=2, help="PPO rollouts timed")
    parser.add_argument("--run-timeout", type=float, default=120.0, help="seconds per run")
    parser.add_argument("--budget", type=float, default=270.0,
                        help="seconds for all runs: a run is not started past it")  # fmt: skip
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    env = args.env or _half_cheetah()
    start = time.monotonic()
    info = machine_info()
    results: list[dict[str, Any]] = []
    for mode in args.modes.split(","):  # every compiled run first: the anchored numbers
        for algo in args.algos.split(","):
            task = dict(algo=algo, mode=mode, device=args.device, env=env, seed=args.seed,
                        learning_starts=args.learning_starts or LEARNING_STARTS.get(algo, 0),
                        warm=args.warm, measure=args.measure_steps, rollout=args.ppo_rollout,
                        rollouts=args.ppo_rollouts)  # fmt: skip
            left = args.budget - (time.monotonic() - start)
            if left < 20:
                result: dict[str, Any] = {
                    "error": f"not run: the {args.budget:.0f} s budget was spent"
                }
            else:
                print(f"[gpu_e2e] {algo} {mode} on {args.device} ({env})", flush=True)
                result = _spawn(task, min(args.run_timeout, left))
            results.append({"task": task, **result})
            print(f"[gpu_e2e] {algo} {mode}: {json.dumps(result)} "
                  f"(+{time.monotonic() - start:.0f} s)", flush=True)  # fmt: skip
    info["gpu"] = next((r["gpu"] for r in results if r.get("gpu")), "—")
    info["env"] = env
    info["load_average_1m_end"] = round(os.getloadavg()[0], 2)
    info["wall_s"] = round(time.monotonic() - start)
    lines = [f"# rlstash end to end ({args.device}) against LeanRL's H100 figures", ""]
    lines += [*header_lines(info), ""]
    lines += [x for para in __doc__.split("\n\n")[2:] for x in (para.replace("``", "`"), "")]
    lines += section(results, args.device)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).with_suffix(".json").write_text(json.dumps(results, indent=1))
    failed = [f"{r['task']['algo']} {r['task']['mode']}" for r in results if "error" in r]
    return publish("\n".join(lines), args.out, "gpu_e2e", failed)


def _half_cheetah() -> str:
    """HalfCheetah-v4 where this gymnasium still registers it (LeanRL's), else -v5."""
    import gymnasium

    return "HalfCheetah-v4" if "HalfCheetah-v4" in gymnasium.registry else "HalfCheetah-v5"


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    raise SystemExit(main())
