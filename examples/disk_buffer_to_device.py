"""A disk (memory-mapped) replay buffer that delivers batches to any device.

Field report 003: a memmap storage refused non-CPU devices and users bolted on
`lambda x: x.to(device)`. Here `device` applies to the final batch, after transforms,
through pinned staging and a synchronized non-blocking copy when the device is CUDA.

    python examples/disk_buffer_to_device.py [--quick]
"""

import tempfile
from pathlib import Path

import torch

from rlstash import Field, MemmapStorage, ReplayBuffer, Spec

device = "cuda" if torch.cuda.is_available() else "cpu"
spec = Spec(
    {
        "obs": Field((4, 84, 84), torch.uint8),
        "action": Field((), torch.int64),
        "reward": Field((), torch.float32),
    }
)
with tempfile.TemporaryDirectory() as tmp:
    storage = MemmapStorage(spec, 2_000, Path(tmp) / "buffer")  # the file is reserved in full now
    to_float = lambda b: {**b, "obs": b["obs"].float().div_(255)}  # noqa: E731 - runs before delivery
    with ReplayBuffer(
        storage,
        transforms=[to_float],
        device=device,
        pin_memory=device == "cuda",
        prefetch=2,
        seed=0,
    ) as rb:
        for _ in range(10):
            rb.extend({
                "obs": torch.randint(0, 256, (100, 4, 84, 84), dtype=torch.uint8),
                "action": torch.randint(0, 6, (100,)),
                "reward": torch.randn(100),
            })  # fmt: skip
        batch = rb.sample(32)
        print({k: (tuple(v.shape), str(v.dtype), str(v.device)) for k, v in batch.items()})
        assert batch["obs"].device.type == device and batch["obs"].dtype == torch.float32
    reopened = ReplayBuffer(
        MemmapStorage.open(Path(tmp) / "buffer"), seed=0
    )  # resumes: data and cursor
    print(f"reopened with {len(reopened)} rows")
    reopened.close()
