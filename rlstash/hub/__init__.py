"""Share trained agents on the Hugging Face Hub (``pip install 'rlstash[hub]'``).

``rlstash push RUN --repo-id USER/NAME`` (:func:`push`) evaluates the run's saved agent,
records a replay video, writes a model card whose metadata the Hub's RL leaderboards read, and
uploads the agent, its settings, the card, the video and the learning curve;
``rlstash pull USER/NAME`` (:func:`pull`) and ``rlstash eval hf://USER/NAME`` fetch it into the
Hugging Face cache (offline once cached) and run it. Modules: :mod:`.refs` (repo ids),
:mod:`.package` (what is uploaded), :mod:`.card` (the model card), :mod:`.client` (upload and
download).
"""

from __future__ import annotations

from rlstash.hub.client import Pushed, pull, push

__all__ = ["Pushed", "pull", "push"]
