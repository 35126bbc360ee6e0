"""Peak memory of one discrete-SAC update: chunked (rlstash) vs a one-hot formulation.

Both formulations use the very same networks (rlstash's DiscreteSAC modules); only the update
differs. The one-hot formulation is what a dense implementation does: actions one-hot [B, n],
Q(s, a) = sum(one_hot * Q(s, .)), and every expectation over actions on full [B, n] tensors
with autograd. rlstash gathers Q(s, a) and streams every expectation in chunks.

Each configuration runs in a fresh subprocess (one torch thread, CPU): build the agent, run
one warm-up update (allocates gradients and Adam moments), record RSS, reset the kernel's
high-water mark (/proc/self/clear_refs), run 3 updates, read the high-water mark (VmHWM).
"peak extra" = high-water - RSS before: the working memory of an update on top of the
networks, gradients and optimizer state.

    .venv/bin/python bench/agent_memory.py            # writes bench/results/agent_memory.md
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BATCH = 64
OBS_DIM = 16
SIZES = [10_000, 100_000, 1_000_000]
HEADS = {"linear": "linear head (hidden 32, a weight row per action)",
         "features": "fixed 16-d action features (embedding head)"}  # fmt: skip


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def onehot_update(agent, batch):  # noqa: ANN001 - the dense formulation, for comparison only
    import torch
    import torch.nn.functional as F

    nets, n, alpha = agent.nets, agent.n_actions, agent.alpha
    one_hot = F.one_hot(batch["action"], n).float()  # [B, n]
    with torch.no_grad():
        logp_next = torch.log_softmax(nets["actor"](batch["next_obs"]), 1)  # [B, n]
        q_next = torch.minimum(
            nets["q1_target"](batch["next_obs"]), nets["q2_target"](batch["next_obs"])
        )
        v = (logp_next.exp() * (q_next - alpha * logp_next)).sum(1)  # [B]
        y = batch["reward"] + agent.config.gamma * v.masked_fill(batch["terminated"], 0.0)
    q1 = (nets["q1"](batch["obs"]) * one_hot).sum(1)  # [B]
    q2 = (nets["q2"](batch["obs"]) * one_hot).sum(1)
    critic_loss = 0.5 * ((q1 - y) ** 2 + (q2 - y) ** 2).mean()
    agent.optims["critic"].zero_grad(set_to_none=True)
    critic_loss.backward()
    agent.optims["critic"].step()
    logp = torch.log_softmax(nets["actor"](batch["obs"]), 1)  # [B, n]
    with torch.no_grad():
        q = torch.minimum(nets["q1"](batch["obs"]), nets["q2"](batch["obs"]))  # [B, n]
    actor_loss = (logp.exp() * (alpha * logp - q)).sum(1).mean()
    agent.optims["actor"].zero_grad(set_to_none=True)
    actor_loss.backward()
    agent.optims["actor"].step()
    entropy = -(logp.exp() * logp).sum(1).detach()
    alpha_loss = (
        nets["alpha"].log_alpha * (entropy - 0.5 * torch.log(torch.tensor(float(n))))
    ).mean()
    agent.optims["alpha"].zero_grad(set_to_none=True)
    alpha_loss.backward()
    agent.optims["alpha"].step()


def child(n: int, head: str, form: str) -> dict:
    import torch

    from rlstash.agents import DiscreteSAC, DiscreteSACConfig
    from rlstash.agents.nets import param_bytes

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    kwargs = {}
    if head == "features":
        cfg = DiscreteSACConfig(
            net_arch=(64,), action_head="embedding", learn_action_embeddings=False
        )
        kwargs["action_features"] = torch.randn(n, 16, generator=g)
    else:
        cfg = DiscreteSACConfig(net_arch=(32,))
    agent = DiscreteSAC((OBS_DIM,), n, cfg, **kwargs)
    batch = {
        "obs": torch.randn(BATCH, OBS_DIM, generator=g),
        "action": torch.randint(0, n, (BATCH,), generator=g),
        "reward": torch.randn(BATCH, generator=g),
        "next_obs": torch.randn(BATCH, OBS_DIM, generator=g),
        "terminated": torch.zeros(BATCH, dtype=torch.bool),
    }
    update = agent.update if form == "chunked" else (lambda b: onehot_update(agent, b))
    update(batch)  # warm-up: gradients and Adam moments now exist
    gc.collect()
    before = _rss_kib("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
    except OSError:  # old kernel / no permission: VmHWM then includes the warm-up update
        print("warning: could not reset VmHWM; peak includes the warm-up", file=sys.stderr)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        update(batch)
        times.append(time.perf_counter() - t0)
    peak = _rss_kib("VmHWM")
    nets = list(agent.nets.values())
    features = kwargs["action_features"].numel() * 4 if kwargs else 0
    return {
        "n": n, "head": head, "form": form,
        "weights_mib": (param_bytes(*nets) + features) / 2**20,
        "rss_before_mib": before / 1024,
        "peak_extra_mib": (peak - before) / 1024,
        "peak_rss_mib": peak / 1024,
        "s_per_update": statistics.median(times),
    }  # fmt: skip


def run_child(n: int, head: str, form: str) -> dict:
    cmd = [sys.executable, __file__, "--child", str(n), head, form]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
    if proc.returncode != 0:
        return {"n": n, "head": head, "form": form, "error": proc.stderr.strip().splitlines()[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    import psutil

    rows = []
    for head in HEADS:
        for n in SIZES:
            for form in ("chunked", "onehot"):
                dense_bytes = BATCH * n * 4  # one [B, n] float32 tensor
                if form == "onehot" and 24 * dense_bytes > psutil.virtual_memory().available:
                    rows.append(
                        {
                            "n": n,
                            "head": head,
                            "form": form,
                            "error": "skipped: not enough free RAM",
                        }
                    )
                    continue
                rows.append(run_child(n, head, form))
                print(json.dumps(rows[-1]), flush=True)
    write_markdown(rows)


def write_markdown(rows: list[dict]) -> None:
    lines = [
        "# Discrete SAC: peak memory per update, chunked vs one-hot",
        "",
        f"Batch {BATCH}, obs dim {OBS_DIM}, CPU, one torch thread, no action mask; same networks",
        "(actor, twin critics, twin targets) in both columns. `peak extra` = RSS high-water during",
        "3 updates minus RSS before them (networks, gradients and Adam moments already allocated,",
        "plus whatever the allocator kept from the warm-up update); `peak RSS` is the high-water.",
        "One [B, n] float32 tensor is B*n*4 bytes: 2.4 MiB at 10^4, 24 MiB at 10^5, 244 MiB at 10^6.",
        "rlstash's chunk is 8192 actions. Produced by `bench/agent_memory.py`. Times are from a",
        "shared 2-core machine with other jobs running: indicative only; memory is the result.",
        "",
        "| head | actions | weights MiB | formulation | RSS before MiB | peak extra MiB | peak RSS MiB | s/update |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['head']} | {r['n']:,} | | {r['form']} | | {r['error']} | | |")
            continue
        lines.append(
            f"| {r['head']} | {r['n']:,} | {r['weights_mib']:.1f} | {r['form']} | "
            f"{r['rss_before_mib']:.0f} | {r['peak_extra_mib']:.1f} | {r['peak_rss_mib']:.0f} | "
            f"{r['s_per_update']:.3f} |"
        )
    lines += ["", "Heads: " + "; ".join(f"`{k}` = {v}" for k, v in HEADS.items()) + "."]
    lines += ["", "Working memory of an update, one-hot / chunked (peak extra):", ""]
    done = {(r["head"], r["n"], r["form"]): r for r in rows if "error" not in r}
    for head in HEADS:
        for n in SIZES:
            c, o = done.get((head, n, "chunked")), done.get((head, n, "onehot"))
            if c and o:
                ratio = o["peak_extra_mib"] / max(c["peak_extra_mib"], 1e-9)
                lines.append(
                    f"- {head}, {n:,} actions: {o['peak_extra_mib']:.0f} MiB vs "
                    f"{c['peak_extra_mib']:.0f} MiB ({ratio:.1f}x)"
                )
    out = Path(__file__).parent / "results" / "agent_memory.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--child", nargs=3, metavar=("N", "HEAD", "FORM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        print(json.dumps(child(int(args.child[0]), args.child[1], args.child[2])))
    else:
        main()
