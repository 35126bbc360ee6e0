"""SAC (continuous actions) on Pendulum-v1, with the replay buffer on disk.

python examples/sac_pendulum.py            # about 20k steps
python examples/sac_pendulum.py --quick    # a few seconds (what CI runs)
"""

import sys
import tempfile

from rlstash.train import TrainConfig, train

quick = "--quick" in sys.argv
cfg = TrainConfig(
    algo="sac",
    env="Pendulum-v1",
    steps=400 if quick else 20_000,
    eval_every=200 if quick else 1000,
    eval_episodes=1 if quick else 10,
    storage="disk",  # memory-mapped, reserved in full up front, resumable
    device="cpu",
    run_dir=tempfile.mkdtemp(prefix="rlstash-example-") if quick else "runs",
    name="example-sac-pendulum",
    quiet=True,
    learning_starts=100 if quick else None,  # None: the preset's
    buffer_size=10_000 if quick else None,
)
result = train(cfg)
print(f"last evaluation return {result.last_eval:.1f} after {result.steps} steps")
