#!/usr/bin/env python3
"""BenchMARL vs rlstash on VMAS (``bench/results/marl.md``), run in ``.venv-marl``
(``bench/setup_marl.py``: benchmarl 1.5.2, torchrl 0.11.1, tensordict 0.11.0, vmas 1.5.2 over
torch 2.13.0 CPU).

    python3 bench/marl.py collect                     # env steps/s: VMAS alone, rlstash, TorchRL
    python3 bench/marl.py learn --seeds 0 1 --frames 60000 --task navigation --algo mappo
    python3 bench/marl.py report                      # the table from bench/results/marl-*.json

``collect``: VMAS navigation at 1,024 envs x 3 agents, uniform random actions, same-step resets
of ended envs, rounds interleaved (VMAS stepped by hand, rlstash's MultiAgentCollector into a
MultiAgentRollout, TorchRL's SyncDataCollector over VmasEnv), medians; bytes per env step of
rlstash's rollout vs TorchRL's collected batch (obs and next obs per agent).

``learn``: one process per (side, seed), each in its own session (the kernel's autogroup
scheduling shares the CPU between sessions: in one session the pair got one job's share); per
seed the two sides run side by side (same machine load), seeds one after the other; both with
BenchMARL's defaults (6,000 frames per batch from 10 envs, minibatch 400, 45 passes, lr 5e-5,
[256, 256] tanh MLPs, tanh-normal, shared parameters; rlstash without the agent-id input, which
BenchMARL does not have, and without bootstrapping at the 100-step horizon: TorchRL's VmasEnv
under BenchMARL reports the horizon as terminated, ``bootstrap_truncated=False``), one torch thread and one inter-op thread each, evaluation every
``--eval-every`` frames (deterministic, 10 episodes; BenchMARL also evaluates after its first
batch). Training seconds, wall and CPU, by the same harness clock on both sides: from the end of
set-up (BenchMARL's ``on_setup``; rlstash's ``drive`` entry) to each evaluation's end, minus
every evaluation (BenchMARL: from the end of the update before it; rlstash: ``_evaluate``).
``report --write`` puts the tables into ``bench/results/marl.md`` between its report markers.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from setup_marl import ensure_marl_venv  # noqa: E402

RESULTS = HERE / "results"
REPORT_START, REPORT_END = "<!-- report: start -->", "<!-- report: end -->"
TASKS = {"navigation": dict(n_agents=3), "balance": dict(n_agents=4)}


# --- collection --------------------------------------------------------------------------------


def _vmas_alone(envs: int, steps: int) -> float:
    import torch
    import vmas

    env = vmas.make_env("navigation", num_envs=envs, seed=0, max_steps=100,
                        terminated_truncated=True, n_agents=3)  # fmt: skip
    env.reset(seed=0)
    n = env.n_agents
    t0 = time.perf_counter()
    for _ in range(steps):
        acts = [torch.rand(envs, 2) * 2 - 1 for _ in range(n)]
        _, _, term, trunc, _ = env.step(acts)
        done = term | trunc
        ended = int(done.sum())
        if ended == envs:
            env.reset()
        elif ended:
            for i in done.nonzero().flatten().tolist():
                env.reset_at(i, return_observations=False)
            env.get_from_scenario(True, False, False, False)
    return envs * steps / (time.perf_counter() - t0)


class _Random:
    def act(self, obs, action_mask=None, deterministic=False):  # noqa: ANN001, ANN201
        import torch

        a = torch.rand(*obs.shape[:2], 2) * 2 - 1
        return a, a, torch.zeros(obs.shape[:2])

    def values(self, obs, state=None):  # noqa: ANN001, ANN201
        return obs.new_zeros(obs.shape[:2])


def _rlstash(envs: int, steps: int) -> tuple[float, int]:
    from rlstash.collect.multiagent import MultiAgentCollector
    from rlstash.envs.vmas import VmasVectorEnv
    from rlstash.storage.marl_rollout import MultiAgentRollout

    env = VmasVectorEnv("navigation", envs, seed=0, max_steps=100, n_agents=3)
    rollout = MultiAgentRollout(steps, envs, 3, env.observation_spaces["agents"].shape[0], (2,))
    collector = MultiAgentCollector(env, seed=0)
    t0 = time.perf_counter()
    collector.collect(_Random(), rollout)
    rate = envs * steps / (time.perf_counter() - t0)
    env.close()
    return rate, rollout.nbytes // (steps * envs)


def _torchrl(envs: int, steps: int) -> tuple[float, int]:
    from torchrl.collectors import SyncDataCollector
    from torchrl.envs.libs.vmas import VmasEnv

    env = VmasEnv("navigation", num_envs=envs, seed=0, max_steps=100, n_agents=3,
                  continuous_actions=True)  # fmt: skip
    frames = envs * steps
    col = SyncDataCollector(env, None, frames_per_batch=frames, total_frames=2 * frames)
    it = iter(col)
    next(it)  # the collector's first batch includes its set-up: timed is the second
    t0 = time.perf_counter()
    batch = next(it)
    rate = frames / (time.perf_counter() - t0)
    nbytes = sum(v.numel() * v.element_size() for v in batch.values(True, True))
    col.shutdown()
    return rate, nbytes // frames


def cmd_collect(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    rates: dict[str, list[float]] = {"vmas": [], "rlstash": [], "torchrl": []}
    sizes = {}
    for r in range(args.rounds):
        rates["vmas"].append(_vmas_alone(args.envs, args.steps))
        rate, sizes["rlstash"] = _rlstash(args.envs, args.steps)
        rates["rlstash"].append(rate)
        rate, sizes["torchrl"] = _torchrl(args.envs, args.steps)
        rates["torchrl"].append(rate)
        print(f"round {r}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rates.items()), flush=True)
    from rlstash.storage.marl_rollout import naive_bytes_per_step

    out = {"envs": args.envs, "steps": args.steps, "rounds": args.rounds, "rates": rates,
           "median": {k: statistics.median(v) for k, v in rates.items()},
           "bytes_per_env_step": {**sizes, "naive": naive_bytes_per_step(3, 18, 2)}}  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "marl-collect.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out["median"]), out["bytes_per_env_step"])


# --- learning ----------------------------------------------------------------------------------


CURVE: list[
    dict
] = []  # BenchMARL's evaluations, appended by its callback (picklable: module level)
_CLOCK: dict[str, float] = {"collected": 0.0}


def _clock_start() -> dict[str, float]:
    """The training clock's start (wall and CPU), taken after set-up on both sides."""
    wall, cpu = time.perf_counter(), time.process_time()
    return {"t0": wall, "cpu0": cpu, "mark": wall, "mark_cpu": cpu, "eval": 0.0, "eval_cpu": 0.0}


def _clock_eval_end() -> dict[str, float]:
    """At the end of an evaluation (which began at the last mark: the end of the last update):
    its seconds join the excluded ones; the training seconds so far, wall and CPU."""
    wall, cpu = time.perf_counter(), time.process_time()
    _CLOCK["eval"] += wall - _CLOCK["mark"]
    _CLOCK["eval_cpu"] += cpu - _CLOCK["mark_cpu"]
    _CLOCK["mark"], _CLOCK["mark_cpu"] = wall, cpu  # the next collection starts here
    return {
        "train_seconds": wall - _CLOCK["t0"] - _CLOCK["eval"],
        "train_cpu_seconds": cpu - _CLOCK["cpu0"] - _CLOCK["eval_cpu"],
    }


ITERS: list[dict] = []  # BenchMARL's per-iteration collection and training seconds


def _curve_callback():  # noqa: ANN202
    """A BenchMARL callback recording (frames, training seconds, evaluation reward)."""
    from benchmarl.experiment import Callback

    global _Curve
    if "_Curve" not in globals():

        class _Curve(Callback):
            def on_setup(self) -> None:
                _CLOCK.update(_clock_start())

            def on_batch_collected(self, batch):  # noqa: ANN001, ANN201
                _CLOCK["collected"] = time.perf_counter()

            def on_train_end(self, training_td, group):  # noqa: ANN001, ANN201
                now = time.perf_counter()
                ITERS.append({"collect": _CLOCK["collected"] - _CLOCK["mark"],
                              "train": now - _CLOCK["collected"]})  # fmt: skip
                _CLOCK["mark"], _CLOCK["mark_cpu"] = now, time.process_time()

            def on_evaluation_end(self, rollouts):  # noqa: ANN001, ANN201
                rewards = [float(r.get(("next", "agents", "reward")).sum(0).mean())
                           for r in rollouts]  # fmt: skip
                CURVE.append({"frames": self.experiment.total_frames,
                              **_clock_eval_end(), "eval_reward": statistics.fmean(rewards)})  # fmt: skip

        _Curve.__qualname__ = "_Curve"
        globals()["_Curve"] = _Curve
    return _Curve()


def _benchmarl(
    task: str, algo: str, seed: int, frames: int, eval_every: int, workdir: Path
) -> list[dict]:
    from benchmarl.algorithms import IppoConfig, MappoConfig
    from benchmarl.environments import VmasTask
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig

    exp_cfg = ExperimentConfig.get_from_yaml()
    exp_cfg.max_n_frames = frames
    exp_cfg.evaluation_interval = eval_every
    exp_cfg.loggers = ["csv"]
    exp_cfg.render = False
    exp_cfg.create_json = False
    exp_cfg.save_folder = str(workdir)
    exp_cfg.checkpoint_at_end = False
    task_cfg = getattr(VmasTask, task.upper()).get_from_yaml()
    algo_cfg = (MappoConfig if algo == "mappo" else IppoConfig).get_from_yaml()
    model = MlpConfig.get_from_yaml()
    exp = Experiment(task=task_cfg, algorithm_config=algo_cfg, model_config=model,
                     critic_model_config=MlpConfig.get_from_yaml(), seed=seed,
                     config=exp_cfg, callbacks=[_curve_callback()])  # fmt: skip
    exp.run()
    return CURVE


def _rlstash_learn(
    task: str, algo: str, seed: int, frames: int, eval_every: int, workdir: Path
) -> list[dict]:
    import rlstash.train.drive as drive_mod
    import rlstash.train.loop as loop_mod
    from rlstash.train.config import TrainConfig
    from rlstash.train.loop import train

    # the same clock as BenchMARL's callback: started when the training loop starts (after
    # set-up), each evaluation excluded from its start to its end
    drive, evaluate = loop_mod.drive, drive_mod._evaluate

    def timed_drive(*a, **k):  # noqa: ANN002, ANN003, ANN202
        _CLOCK.update(_clock_start())
        return drive(*a, **k)

    def timed_evaluate(run, log):  # noqa: ANN001, ANN202
        _CLOCK["mark"], _CLOCK["mark_cpu"] = time.perf_counter(), time.process_time()
        evaluate(run, log)
        CURVE.append({"frames": run.step, **_clock_eval_end(),
                      "eval_reward": run.evals[-1]["return_mean"],
                      "rlstash_train_seconds": run.train_seconds})  # fmt: skip

    loop_mod.drive, drive_mod._evaluate = timed_drive, timed_evaluate
    cfg = TrainConfig(algo=algo, env=f"vmas/{task}", steps=frames, seed=seed, device="cpu",
                      eval_every=eval_every, eval_episodes=10, checkpoint_every=10**9,
                      run_dir=str(workdir), name=f"{algo}-{task}-s{seed}", quiet=True,
                      agent={"agent_id": False, "bootstrap_truncated": False})  # fmt: skip
    train(cfg)
    return CURVE


def cmd_one(args: argparse.Namespace) -> None:
    """One (side, seed) run in this process; its curve to --out. One torch thread on both
    sides, set here before either builds anything; the process's CPU seconds are recorded
    beside its wall seconds (their ratio: the share of one core it got)."""
    import tempfile

    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    fn = _benchmarl if args.side == "benchmarl" else _rlstash_learn
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        curve = fn(args.task, args.algo, args.seed, args.frames, args.eval_every, Path(tmp))
        wall = time.perf_counter() - t0
    use = resource.getrusage(resource.RUSAGE_SELF)
    Path(args.out).write_text(json.dumps({"side": args.side, "task": args.task, "algo": args.algo,
                                          "seed": args.seed, "frames": args.frames,
                                          "eval_every": args.eval_every,
                                          "horizon": "terminal",  # no bootstrap at max_steps
                                          "threads": torch.get_num_threads(),
                                          "wall_seconds": wall,
                                          "cpu_seconds": use.ru_utime + use.ru_stime,
                                          "load_before": load0, "load_after": os.getloadavg(),
                                          "iters": ITERS, "curve": curve}))  # fmt: skip


def cmd_learn(args: argparse.Namespace) -> None:
    """Per seed, BenchMARL and rlstash side by side (two processes started together, so both
    see the same machine load), seeds one after the other."""
    RESULTS.mkdir(exist_ok=True)
    for seed in args.seeds:
        procs = []
        for side in ("benchmarl", "rlstash"):
            out = RESULTS / f"marl-{args.algo}-{args.task}-{side}-s{seed}.json"
            cmd = [sys.executable, __file__, "one", "--side", side, "--task", args.task,
                   "--algo", args.algo, "--seed", str(seed), "--frames", str(args.frames),
                   "--eval-every", str(args.eval_every), "--out", str(out)]  # fmt: skip
            print(" ".join(cmd), flush=True)
            procs.append(subprocess.Popen(cmd, start_new_session=True))
        for proc in procs:
            proc.wait()


def _learn_runs() -> dict[tuple[str, str], dict[str, dict[int, dict]]]:
    """The learning runs on disk: {(algo, task): {side: {seed: run}}}."""
    out: dict[tuple[str, str], dict[str, dict[int, dict]]] = {}
    for path in sorted(RESULTS.glob("marl-*-s*.json")):
        r = json.loads(path.read_text())
        if path.name != f"marl-{r['algo']}-{r['task']}-{r['side']}-s{r['seed']}.json":
            continue  # an earlier run kept under another name
        out.setdefault((r["algo"], r["task"]), {}).setdefault(r["side"], {})[r["seed"]] = r
    return out


def _at(run: dict, frames: int) -> dict | None:
    return next((c for c in run["curve"] if c["frames"] == frames), None)


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _reward_verdict(bm: list[float], rl: list[float]) -> str:
    mb, mr = statistics.median(bm), statistics.median(rl)
    if mr >= mb:
        return "rlstash >= BenchMARL"
    if len(bm) > 1 and mr >= min(bm):
        return "below, within BenchMARL's seed range"
    return "BELOW" + ("" if len(bm) > 1 else " (one seed: no noise estimate)")


def _group_report(algo: str, task: str, sides: dict[str, dict[int, dict]]) -> list[str]:
    bm_runs, rl_runs = sides.get("benchmarl", {}), sides.get("rlstash", {})
    seeds = sorted(set(bm_runs) & set(rl_runs))
    title = f"### {algo.upper()} on vmas/{task}: seeds {', '.join(map(str, seeds))}"
    if not seeds:
        return [title, "", "(no seed with both sides finished)"]
    frames = sorted(
        {c["frames"] for s in seeds for r in (bm_runs[s], rl_runs[s]) for c in r["curve"]}
    )
    head = "| frames | " + " | ".join(f"BenchMARL s{s} | rlstash s{s}" for s in seeds)
    lines = [title, "", "Evaluation reward (deterministic, 10 episodes) at equal frames:", "",
             head + " | median BenchMARL | median rlstash | verdict |",
             "|---" * (2 * len(seeds) + 4) + "|"]  # fmt: skip
    rows_r, rows_t = [], []
    for f in frames:
        bm = [_at(bm_runs[s], f) for s in seeds]
        rl = [_at(rl_runs[s], f) for s in seeds]
        cells = [x for b, r in zip(bm, rl) for x in (b, r)]
        rew = [_fmt(c and c["eval_reward"], ".3f") for c in cells]
        both = all(b is not None and r is not None for b, r in zip(bm, rl))
        if both:
            bv, rv = [b["eval_reward"] for b in bm], [r["eval_reward"] for r in rl]
            tail = [f"{statistics.median(bv):.3f}", f"{statistics.median(rv):.3f}",
                    _reward_verdict(bv, rv)]  # fmt: skip
        else:
            tail = ["-", "-", "(not on both sides for every seed)"]
        rows_r.append(f"| {f:,} | " + " | ".join(rew + tail) + " |")
        ratios = [r["train_seconds"] / b["train_seconds"] for b, r in zip(bm, rl) if b and r]
        secs = []
        for b, r in zip(bm, rl):
            secs += [_fmt(b and b["train_seconds"], ".0f"), _fmt(r and r["train_seconds"], ".0f"),
                     _fmt(b and r and r["train_seconds"] / b["train_seconds"], ".2f")]  # fmt: skip
        med = f"{statistics.median(ratios):.2f}" if len(ratios) == len(seeds) else "-"
        rows_t.append(f"| {f:,} | " + " | ".join(secs) + f" | {med} |")
    lines += rows_r
    lines += ["", "Training seconds (evaluation excluded on both sides) at equal frames, and "
              "rlstash / BenchMARL:", "",
              "| frames | " + " | ".join(f"BenchMARL s{s} | rlstash s{s} | ratio s{s}"
                                        for s in seeds) + " | median ratio |",
              "|---" * (3 * len(seeds) + 2) + "|", *rows_t]  # fmt: skip
    lines += ["", "At equal training seconds: each BenchMARL evaluation beside rlstash's latest "
              "evaluation within the same training seconds:", "",
              "| seed | BenchMARL frames | BenchMARL s | BenchMARL reward | rlstash frames | "
              "rlstash s | rlstash reward |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for s in seeds:
        for b in bm_runs[s]["curve"]:
            done = [c for c in rl_runs[s]["curve"] if c["train_seconds"] <= b["train_seconds"]]
            r = done[-1] if done else None
            lines.append(f"| {s} | {b['frames']:,} | {b['train_seconds']:.0f} | "
                         f"{b['eval_reward']:.3f} | {_fmt(r and r['frames'], ',')} | "
                         f"{_fmt(r and r['train_seconds'], '.0f')} | "
                         f"{_fmt(r and r['eval_reward'], '.3f')} |")  # fmt: skip
    lines += ["", "Runs (per seed the two sides ran side by side, started together):", ""]
    for s in seeds:
        for side, r in (("BenchMARL", bm_runs[s]), ("rlstash", rl_runs[s])):
            lb, la = r.get("load_before"), r.get("load_after")
            load = (
                f"load {lb[0]:.1f} before, {la[0]:.1f} after" if lb and la else "load not recorded"
            )
            cpu = r.get("cpu_seconds")
            share = f", {cpu:.0f} CPU s ({cpu / r['wall_seconds']:.2f} of a core)" if cpu else ""
            last = r["curve"][-1] if r["curve"] else {}
            tcpu = last.get("train_cpu_seconds")
            tcpu = f", {tcpu:.0f} training CPU s to {last['frames']:,} frames" if tcpu else ""
            lines.append(f"- s{s} {side}: {r['frames']:,} frames, {r['wall_seconds']:.0f} s wall "
                         f"whole run{share}{tcpu}, {r.get('threads', '?')} torch thread(s); "
                         f"{load}")  # fmt: skip
    return lines


def cmd_report(args: argparse.Namespace) -> None:
    """The learning tables (per algo and task) and the collection numbers as markdown; with
    --write, they replace the part of bench/results/marl.md between the report markers."""
    lines: list[str] = []
    for (algo, task), sides in sorted(_learn_runs().items()):
        lines += [*_group_report(algo, task, sides), ""]
    path = RESULTS / "marl-collect.json"
    if path.exists() and not args.write:  # marl.md keeps its own collection section
        c = json.loads(path.read_text())
        m = c["median"]
        lines += ["", f"collection, VMAS navigation {c['envs']:,} envs x 3 agents, {c['steps']} "
                  f"steps, median of {c['rounds']} rounds (env steps/s):", "",
                  "| VMAS alone | rlstash | TorchRL SyncDataCollector | rlstash / VMAS | "
                  "rlstash / TorchRL |", "|---|---|---|---|---|",
                  f"| {m['vmas']:,.0f} | {m['rlstash']:,.0f} | {m['torchrl']:,.0f} | "
                  f"{m['rlstash'] / m['vmas']:.2f}x | {m['rlstash'] / m['torchrl']:.2f}x |",
                  "", f"bytes per env step: {c['bytes_per_env_step']}"]  # fmt: skip
    text = "\n".join(lines)
    if not args.write:
        print(text)
        return
    md = RESULTS / "marl.md"
    doc = md.read_text()
    a, b = doc.index(REPORT_START) + len(REPORT_START), doc.index(REPORT_END)
    md.write_text(doc[:a] + "\n" + text + "\n" + doc[b:])


def main() -> None:
    ensure_marl_venv(__file__)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--envs", type=int, default=1024)
    c.add_argument("--steps", type=int, default=100)
    c.add_argument("--rounds", type=int, default=3)
    c.set_defaults(fn=cmd_collect)
    for name, fn in (("learn", cmd_learn), ("one", cmd_one)):
        s = sub.add_parser(name)
        s.add_argument("--task", default="navigation", choices=sorted(TASKS))
        s.add_argument("--algo", default="mappo", choices=("mappo", "ippo"))
        s.add_argument("--frames", type=int, default=90_000)
        s.add_argument(
            "--eval-every",
            type=int,
            default=18_000,
            help="frames between evaluations, a multiple of 6,000 (both sides)",
        )
        if name == "learn":
            s.add_argument("--seeds", type=int, nargs="+", default=[0])
        else:
            s.add_argument("--side", required=True, choices=("benchmarl", "rlstash"))
            s.add_argument("--seed", type=int, default=0)
            s.add_argument("--out", required=True)
        s.set_defaults(fn=fn)
    r = sub.add_parser("report")
    r.add_argument("--write", action="store_true", help="into bench/results/marl.md")
    r.set_defaults(fn=cmd_report)
    args = p.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
