#!/usr/bin/env python3
"""Diagnostics for what the first GPU run of bench/gpu_check.sh found (issue 28).

1. Does a CPU optimizer step initialise CUDA on a machine with a GPU? torch's own Adam, then
   rlstash's FlatAdam (which skips torch's capture check on CPU), each in a fresh process:
   ``torch.cuda.is_initialized()`` after 3 steps and whether nvidia-smi lists the process.
2. DQN eager vs compiled (inductor, no graphs) vs compiled + CUDA graphs, update by update:
   max |difference| of q and q_target against eager, and tau_now.
"""

from __future__ import annotations

import subprocess
import sys
import time

CHILD = r"""
import os, subprocess, sys, time, torch
which = sys.argv[1]
net = torch.nn.Linear(8, 8)
if which == "torch":
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(3):
        opt.zero_grad(); net(torch.randn(4, 8)).sum().backward(); opt.step()
else:
    from rlstash.agents.compiled import FlatAdam
    group = FlatAdam([net], lr=1e-3)
    for _ in range(3):
        group.step(net(torch.randn(4, 8)).sum())
init = torch.cuda.is_initialized()
try:
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                           "--format=csv,noheader"], capture_output=True, text=True).stdout
except OSError as exc:
    apps = ""
    print("nvidia-smi:", exc)
mine = [l for l in apps.splitlines() if l.split(",")[0].strip() == str(os.getpid())]
print(f"{which}: torch.cuda.is_initialized()={init}; nvidia-smi lists this process: {mine or 'no'}")
"""


def context_check() -> None:
    for which in ("torch", "rlstash"):
        out = subprocess.run([sys.executable, "-c", CHILD, which], capture_output=True, text=True,
                             timeout=120)  # fmt: skip
        print(out.stdout.strip() or out.stderr[-2000:], flush=True)


def dqn_check() -> None:
    import torch

    import rlstash.agents.compiled as compiled
    from tests.agents.test_compiled import AGENTS

    make, batch_of = AGENTS["dqn"]
    eager = make(False).to("cuda")
    comp = make(True).to("cuda")
    graphed = make(True).to("cuda")
    comp.load_state_dict(eager.state_dict())
    graphed.load_state_dict(eager.state_dict())
    saved = compiled.GRAPH_DEVICES
    for i in range(8):
        batch = {k: v.cuda() for k, v in batch_of(i % 3).items()}
        eager.update(batch)
        compiled.GRAPH_DEVICES = ()  # comp's step: compiled, not graphed (built on first call)
        comp.update(batch)
        compiled.GRAPH_DEVICES = saved
        graphed.update(batch)
        torch.cuda.synchronize()
        row = [f"update {i + 1}: tau_now e/c/g {float(eager.tau_now):.2f}/"
               f"{float(comp.tau_now):.2f}/{float(graphed.tau_now):.2f}"]  # fmt: skip
        for name in ("q", "q_target"):
            for other, tag in ((comp, "compiled"), (graphed, "graphed")):
                d = max(
                    (a - b).abs().max().item()
                    for a, b in zip(eager.nets[name].parameters(), other.nets[name].parameters())
                )
                row.append(f"{name} {tag} {d:.2e}")
        print("; ".join(row), flush=True)
    print("steps:", {k: type(v).__name__ for k, v in graphed._steps.items()}, flush=True)


if __name__ == "__main__":
    t = time.time()
    context_check()
    dqn_check()
    print(f"done in {time.time() - t:.1f} s")
