"""DQN on CartPole-v1 until solved: the same run as `rlstash train` with no arguments.

python examples/dqn_cartpole.py            # trains until evaluations stay >= 475
python examples/dqn_cartpole.py --quick    # a few seconds (what CI runs)
"""

import sys
import tempfile

from rlstash.train import TrainConfig, train

quick = "--quick" in sys.argv
run_dir = tempfile.mkdtemp(prefix="rlstash-example-") if quick else "runs"
cfg = TrainConfig(
    algo="dqn",
    env="CartPole-v1",
    steps=1500 if quick else 100_000,
    eval_every=500 if quick else 1000,
    eval_episodes=2 if quick else 10,
    device="cpu",
    run_dir=run_dir,
    name="example-dqn-cartpole",
    quiet=True,
    learning_starts=200 if quick else None,  # None: the preset's (1000)
)
result = train(cfg)
print(f"solved={result.solved} after {result.steps} steps; plot: {result.plot}")
