"""Offline RL from Minari datasets (issue 26): rlstash against TorchRL on the same dataset.

    python3 bench/offline.py                      # writes bench/results/offline.md (+ .json)
    python3 bench/offline.py --steps 100000       # dataset size (env steps)
    python3 bench/offline.py --no-compile         # rlstash eager only (no inductor compile)

Measured, in one process run under ``.venv-bench`` (TorchRL 0.14.1), interleaved, medians:

1. Dataset: ``--steps`` env steps of ``--env`` (HalfCheetah-v5) with uniformly random actions,
   written with ``minari.create_dataset_from_buffers`` (a "random" dataset; a "medium" one from
   a trained SAC is not made here, see the results' notes).
2. Load time: ``ReplayBuffer.from_minari`` (rlstash) vs ``minari.load_dataset`` plus a plain
   loop copying every episode's (obs, next_obs, action, reward, terminated, truncated) into
   preallocated numpy arrays, vs TorchRL's ``MinariExperienceReplay(load_from_local_minari=
   True)``; medians of ``--reps`` loads each, alternating.
3. Bytes held by the loaded buffer: rlstash's ``storage.nbytes`` (each observation once, plus
   the lanes' bookkeeping) vs the bytes of every tensor in TorchRL's storage (observation and
   next observation, action, reward, flags, ...).
4. Gradient steps/s: each side samples a batch of 256 from its own buffer over the dataset and
   takes one update with the sota-implementations settings (256 x 256 ReLU MLPs, Adam lr
   3e-4, gamma 0.99, tau 0.005; IQL expectile 0.7, temperature 3; TD3+BC alpha 2.5, policy
   delay 2, noise 0.2 clipped at 0.5), one torch thread, CPU. rlstash eager and compiled
   (``compile=True``, inductor; compilation before timing, reported apart) vs TorchRL eager
   (``IQLLoss``/``TD3BCLoss`` with the update loops of ``sota-implementations/iql/
   iql_offline.py`` and ``td3_bc/td3_bc.py``). common.interleaved, CPU-seconds clock.

``--dataset ID`` measures an existing local dataset instead (bench/make_offline_data.py's
Hopper-v5 random and SAC datasets), ``--parts load`` the loading only. TorchRL's loader is
wrapped in ``torchrl_minari_fix`` (TorchRL 0.14.1 otherwise hands out an all-zero copy).
Learning runs (normalised return at equal gradient steps): bench/offline_learn.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "offline.md"
BATCH = 256
HIDDEN = (256, 256)


# ------------------------------------------------------------------ dataset
def make_dataset(dataset_id: str, env_id: str, steps: int, seed: int) -> Any:
    """A Minari dataset of ``steps`` uniformly random steps of ``env_id``."""
    import gymnasium as gym
    import minari
    import numpy as np
    from minari.data_collector.episode_buffer import EpisodeBuffer

    env = gym.make(env_id)
    env.action_space.seed(seed)
    episodes, done_steps, ep_seed = [], 0, seed
    while done_steps < steps:
        obs, _ = env.reset(seed=ep_seed)
        ep_seed += 1
        o, a, r, te, tr = [obs], [], [], [], []
        while True:
            act = env.action_space.sample()
            obs, rew, term, trunc, _ = env.step(act)
            o.append(obs), a.append(act), r.append(rew), te.append(term), tr.append(trunc)
            done_steps += 1
            if term or trunc or done_steps >= steps:
                break
        tr[-1] = tr[-1] or not te[-1]
        episodes.append(
            EpisodeBuffer(
                observations=np.stack(o),
                actions=np.stack(a),
                rewards=np.array(r),
                terminations=np.array(te),
                truncations=np.array(tr),
            )  # fmt: skip
        )
    with warnings.catch_warnings():  # Minari's advice to set author, code_permalink, ...
        warnings.simplefilter("ignore", UserWarning)
        return minari.create_dataset_from_buffers(
            dataset_id, episodes, env=env_id, algorithm_name="random"
        )


# ------------------------------------------------------------------ loading
def load_rlstash(dataset_id: str) -> Any:
    from rlstash import ReplayBuffer

    return ReplayBuffer.from_minari(dataset_id, seed=0)


def load_plain(dataset_id: str) -> dict[str, Any]:
    """minari.load_dataset and a plain loop into preallocated (obs, next_obs, ...) arrays."""
    import minari
    import numpy as np

    ds = minari.load_dataset(dataset_id)
    n = ds.total_steps
    od = ds.observation_space.shape
    ad = ds.action_space.shape
    out = {
        "obs": np.empty((n, *od), np.float32), "next_obs": np.empty((n, *od), np.float32),
        "action": np.empty((n, *ad), np.float32), "reward": np.empty(n, np.float32),
        "terminated": np.empty(n, bool), "truncated": np.empty(n, bool),
    }  # fmt: skip
    i = 0
    for ep in ds.iterate_episodes():
        t = len(ep.rewards)
        out["obs"][i : i + t] = ep.observations[:-1]
        out["next_obs"][i : i + t] = ep.observations[1:]
        out["action"][i : i + t] = ep.actions
        out["reward"][i : i + t] = ep.rewards
        out["terminated"][i : i + t] = ep.terminations
        out["truncated"][i : i + t] = ep.truncations
        i += t
    return out


@contextlib.contextmanager
def torchrl_minari_fix() -> Any:
    """TorchRL 0.14.1's ``MinariExperienceReplay`` ends its preprocessing with
    ``td_data = td_data.memmap_like(root)``: a contentless (zero-filled) memory-mapped copy of
    the episodes it has just read, so its storage and the files under ``root`` hold only zeros
    (seen 2026-11-27: every action and observation 0; also in pytorch/rl main of 2026-08-22,
    torchrl/data/datasets/minari_data.py). Within this block ``memmap_like`` writes the
    contents (``memmap_``), so TorchRL trains on the dataset. Load times are unaffected."""
    from tensordict import TensorDict

    original = TensorDict.memmap_like

    def filled(self: Any, prefix: Any = None, *args: Any, **kwargs: Any) -> Any:
        return self.memmap_(prefix)

    TensorDict.memmap_like = filled
    try:
        yield
    finally:
        TensorDict.memmap_like = original


def load_torchrl(dataset_id: str, root: str) -> Any:
    from torchrl.data.datasets.minari_data import MinariExperienceReplay

    shutil.rmtree(root, ignore_errors=True)
    with torchrl_minari_fix():
        return MinariExperienceReplay(
            dataset_id, batch_size=BATCH, root=root, load_from_local_minari=True
        )


def torchrl_sampling(trb: Any) -> Any:
    """``trb`` as sota-implementations samples it: float64 MuJoCo observations cast to float32
    on sampling (``DoubleToFloat``), like rlstash's networks cast them."""
    from torchrl.envs import DoubleToFloat

    trb.append_transform(DoubleToFloat())
    return trb


def tensor_bytes(td: Any) -> int:
    """Bytes of every tensor leaf of a TensorDict."""
    return sum(
        t.numel() * t.element_size() for t in td.values(include_nested=True, leaves_only=True)
    )


def measure_loading(dataset_id: str, reps: int) -> dict[str, Any]:
    import gc

    root = tempfile.mkdtemp(prefix="torchrl-minari-")
    times: dict[str, list[float]] = {"rlstash": [], "plain": [], "torchrl": []}
    held: dict[str, int] = {}
    try:
        for rep in range(reps):
            order = ["rlstash", "plain", "torchrl"]
            order = order[rep % 3 :] + order[: rep % 3]
            for name in order:
                gc.collect()
                start = time.perf_counter()
                if name == "rlstash":
                    rb = load_rlstash(dataset_id)
                    times[name].append(time.perf_counter() - start)
                    held[name] = int(rb.storage.nbytes)
                    rb.close()
                elif name == "plain":
                    out = load_plain(dataset_id)
                    times[name].append(time.perf_counter() - start)
                    held[name] = sum(int(v.nbytes) for v in out.values())
                    del out
                else:
                    try:
                        trb = load_torchrl(dataset_id, root)
                    except Exception as exc:  # reported, never dropped silently
                        times[name].append(float("nan"))
                        held[name] = -1
                        held["torchrl_error"] = f"{type(exc).__name__}: {exc}"[:300]
                        continue
                    times[name].append(time.perf_counter() - start)
                    held[name] = tensor_bytes(trb.storage._storage)
                    del trb
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"seconds": times, "bytes": held}


# ------------------------------------------------------------------ updates
def rlstash_update(algo: str, rb: Any, obs_dim: int, act_dim: int, compile_: bool) -> Any:
    import torch

    from rlstash.agents.iql import IQL, IQLConfig
    from rlstash.agents.td3_bc import TD3BC, TD3BCConfig

    if algo == "iql":
        agent: Any = IQL((obs_dim,), act_dim, -1.0, 1.0, IQLConfig(compile=compile_))
    else:
        agent = TD3BC((obs_dim,), act_dim, -1.0, 1.0, TD3BCConfig(compile=compile_))
    if compile_:
        start = time.perf_counter()
        for _ in range(4):
            agent.update(rb.sample(BATCH))
        agent.bench_compile_s = time.perf_counter() - start
    del torch

    def run(n: int) -> None:
        for _ in range(n):
            agent.update(rb.sample(BATCH))

    return run, agent


def torchrl_update(algo: str, trb: Any, obs_dim: int, act_dim: int, adam_eps: float = 1e-8) -> Any:
    """The update loop of TorchRL's sota-implementations (iql_offline.py, td3_bc.py) with
    their modules (iql/utils.py, td3_bc/utils.py) on ``trb``'s batches: (run, step, actor).
    ``adam_eps``: td3_bc/config.yaml's is 1e-4 (bench/offline_learn.py), IQL's the default."""
    import torch
    from tensordict.nn import NormalParamExtractor, TensorDictModule
    from torchrl.data import Bounded
    from torchrl.modules import MLP, ProbabilisticActor, TanhModule, TanhNormal, ValueOperator
    from torchrl.objectives import IQLLoss, SoftUpdate, TD3BCLoss

    spec = Bounded(-torch.ones(act_dim), torch.ones(act_dim), (act_dim,))
    relu = torch.nn.ReLU
    qnet = MLP(num_cells=list(HIDDEN), out_features=1, activation_class=relu)
    qvalue = ValueOperator(in_keys=["observation", "action"], module=qnet)
    if algo == "iql":
        net = torch.nn.Sequential(
            MLP(num_cells=list(HIDDEN), out_features=2 * act_dim, activation_class=relu),
            NormalParamExtractor(scale_mapping="biased_softplus_1.0", scale_lb=0.1),
        )
        actor = ProbabilisticActor(
            spec=spec, in_keys=["loc", "scale"],
            module=TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]),
            distribution_class=TanhNormal,
            distribution_kwargs={"low": spec.space.low, "high": spec.space.high, "tanh_loc": False},
        )  # fmt: skip
        value = ValueOperator(
            in_keys=["observation"],
            module=MLP(num_cells=list(HIDDEN), out_features=1, activation_class=relu),
        )
        td = trb.sample()
        with torch.no_grad():  # lazy layers get their shapes
            actor(td.clone()), qvalue(td.clone()), value(td.clone())
        loss = IQLLoss(actor, qvalue, value_network=value, loss_function="l2",
                       temperature=3.0, expectile=0.7)  # fmt: skip
        loss.make_value_estimator(gamma=0.99)
        updater = SoftUpdate(loss, tau=0.005)
        opts = [
            torch.optim.Adam(list(p.flatten_keys().values()), lr=3e-4, eps=adam_eps)
            for p in (loss.qvalue_network_params, loss.actor_network_params,
                      loss.value_network_params)
        ]  # fmt: skip

        def step() -> None:
            data = trb.sample()
            for o in opts:
                o.zero_grad(set_to_none=True)
            out = loss(data)
            (out["loss_actor"] + out["loss_value"] + out["loss_qvalue"]).backward()
            for o in opts:
                o.step()
            updater.step()

    else:
        actor = TensorDictModule(
            torch.nn.Sequential(
                MLP(num_cells=list(HIDDEN), out_features=act_dim, activation_class=relu),
            ),
            in_keys=["observation"], out_keys=["param"],
        )  # fmt: skip
        from tensordict.nn import TensorDictSequential

        actor = TensorDictSequential(
            actor, TanhModule(in_keys=["param"], out_keys=["action"], spec=spec)
        )
        td = trb.sample()
        with torch.no_grad():
            actor(td.clone()), qvalue(td.clone())
        loss = TD3BCLoss(actor_network=actor, qvalue_network=qvalue, action_spec=spec,
                         num_qvalue_nets=2, loss_function="l2", policy_noise=0.2,
                         noise_clip=0.5, alpha=2.5)  # fmt: skip
        loss.make_value_estimator(gamma=0.99)
        updater = SoftUpdate(loss, tau=0.005)
        actor_opt = torch.optim.Adam(
            list(loss.actor_network_params.values(True, True)), lr=3e-4, eps=adam_eps
        )
        critic_opt = torch.optim.Adam(
            list(loss.qvalue_network_params.values(True, True)), lr=3e-4, eps=adam_eps
        )
        count = [0]

        def step() -> None:
            data = trb.sample()
            count[0] += 1
            q_loss, *_ = loss.qvalue_loss(data)
            critic_opt.zero_grad()
            q_loss.backward()
            critic_opt.step()
            if count[0] % 2 == 0:
                actor_loss, _ = loss.actor_loss(data)
                actor_opt.zero_grad()
                actor_loss.backward()
                actor_opt.step()
                updater.step()

    def run(n: int) -> None:
        for _ in range(n):
            step()

    return run, step, actor


def measure_updates(dataset_id: str, reps: int, compiled: bool) -> dict[str, Any]:
    import torch
    from common import interleaved, use_cpu_clock

    torch.set_num_threads(1)
    use_cpu_clock()
    root = tempfile.mkdtemp(prefix="torchrl-minari-")
    rb = load_rlstash(dataset_id)
    trb = torchrl_sampling(load_torchrl(dataset_id, root))
    obs_dim = rb.storage.spec["obs"].shape[0]
    act_dim = rb.storage.spec["action"].shape[0]
    out: dict[str, Any] = {}
    try:
        for algo in ("iql", "td3_bc"):
            runs = {"rlstash eager": rlstash_update(algo, rb, obs_dim, act_dim, False)[0]}
            compile_s = None
            if compiled:
                run, agent = rlstash_update(algo, rb, obs_dim, act_dim, True)
                runs["rlstash compiled"], compile_s = run, agent.bench_compile_s
            runs["torchrl eager"] = torchrl_update(algo, trb, obs_dim, act_dim)[0]
            timings = interleaved(runs, reps=reps, target_s=1.0)
            out[algo] = {
                name: {"median": t.median, "rates": t.rates} for name, t in timings.items()
            }
            out[algo]["compile_s"] = compile_s
            print(f"[offline] {algo}: {json.dumps(out[algo])}", flush=True)
    finally:
        rb.close()
        shutil.rmtree(root, ignore_errors=True)
    return out


# ------------------------------------------------------------------ report
def report(info: dict, args: Any, load: dict, updates: dict) -> str:
    from common import header_lines, load_sentence

    med = {k: statistics.median(v) for k, v in load["seconds"].items() if v} if load else {}
    lines = [
        "# Offline RL: Minari datasets, IQL and TD3+BC, rlstash vs TorchRL",
        "",
        *header_lines(info),
        "",
        load_sentence(
            info.get("load_average_1m"), info.get("load_average_1m_end"), info.get("usable_cores")
        ),
        "",
        f"Dataset: `{args.dataset}`, {args.steps:,} steps of {args.env}"
        + (f" ({args.episodes:,} episodes)" if getattr(args, "episodes", None) else "")
        + " (Minari, hdf5).",
        "",
    ]
    if load is not None:
        lines += load_table(load, med)
    if updates is not None:
        lines += update_table(updates)
    return "\n".join(lines) + "\n"


def load_table(load: dict, med: dict) -> list[str]:
    from common import fmt_bytes, markdown_table

    lines = ["## Load time and bytes held", ""]
    rows = []
    for name, label in (("rlstash", "rlstash `ReplayBuffer.from_minari`"),
                        ("plain", "`minari.load_dataset` + plain loop (numpy, obs + next_obs)"),
                        ("torchrl", "TorchRL `MinariExperienceReplay`")):  # fmt: skip
        held = load["bytes"].get(name)
        rows.append([
            label, f"{med.get(name, float('nan')):.2f} s",
            fmt_bytes(held) if held and held > 0 else "n/a",
            f"{held / load['bytes']['torchrl']:.2f}x"
            if held and held > 0 and load["bytes"].get("torchrl", -1) > 0 else "n/a",
        ])  # fmt: skip
    lines.append(markdown_table(["loader", "load (median)", "bytes held", "vs TorchRL"], rows))
    if "torchrl_error" in load["bytes"]:
        lines += ["", f"TorchRL failed: `{load['bytes']['torchrl_error']}`"]
    return lines


def update_table(updates: dict) -> list[str]:
    from common import markdown_table

    lines = ["", "## Gradient steps per second (batch 256, 256 x 256, one thread)", ""]
    rows = []
    for algo, res in updates.items():
        base = res["torchrl eager"]["median"]
        for name in ("rlstash eager", "rlstash compiled", "torchrl eager"):
            if name in res:
                rows.append([algo, name, f"{res[name]['median']:.1f}",
                             f"{res[name]['median'] / base:.2f}x"])  # fmt: skip
        if res.get("compile_s"):
            rows.append([algo, "(rlstash compile + 4 updates)", f"{res['compile_s']:.0f} s", ""])
    lines.append(markdown_table(["algo", "side", "updates/s (median)", "vs TorchRL"], rows))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--steps", type=int, default=1_000_000, help="dataset env steps")
    parser.add_argument(
        "--dataset",
        default="",
        help="an existing local Minari dataset "
        "(bench/make_offline_data.py; its env and steps) instead of a new one",
    )
    parser.add_argument("--parts", default="load,updates", help="load, updates or both")
    parser.add_argument("--reps", type=int, default=3, help="loads per loader")
    parser.add_argument("--update-reps", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true", help="skip rlstash compiled")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    from bench_venv import ensure_bench_venv

    ensure_bench_venv(__file__)
    from common import machine_info

    home = None
    if args.dataset:
        from make_offline_data import MINARI_HOME

        os.environ.setdefault("MINARI_DATASETS_PATH", str(MINARI_HOME))
        import minari

        ds = minari.load_dataset(args.dataset)
        args.env, args.steps = ds.env_spec.id, ds.total_steps
        args.episodes = ds.total_episodes
        del ds
    else:
        home = tempfile.mkdtemp(prefix="minari-bench-")
        os.environ["MINARI_DATASETS_PATH"] = home
        args.dataset = f"bench/{args.env.split('-')[0].lower()}/random-v0"
    parts = set(args.parts.split(","))
    try:
        info = machine_info()
        if home:
            start = time.perf_counter()
            make_dataset(args.dataset, args.env, args.steps, seed=0)
            print(f"[offline] dataset made in {time.perf_counter() - start:.0f} s", flush=True)
        load = measure_loading(args.dataset, args.reps) if "load" in parts else None
        print(f"[offline] load: {json.dumps(load)}", flush=True)
        updates = (
            measure_updates(args.dataset, args.update_reps, not args.no_compile)
            if "updates" in parts
            else None
        )
        info["load_average_1m_end"] = round(os.getloadavg()[0], 2)
        text = report(info, args, load, updates)
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(
            json.dumps({"args": vars(args), "load": load, "updates": updates}, indent=1)
        )
        print(text)
    finally:
        if home:
            shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    raise SystemExit(main())
