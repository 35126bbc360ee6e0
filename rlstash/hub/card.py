"""The model card (``README.md``) of a pushed agent: YAML metadata the Hub reads, then text.

The metadata has the layout ``huggingface_sb3``'s ``package_to_hub`` writes (and the Hub's
Deep RL leaderboards read): ``library_name``, ``tags`` (the env id first, then
``deep-reinforcement-learning``, ``reinforcement-learning``, ``rlstash`` and the algorithm)
and a ``model-index`` with one result: task ``reinforcement-learning``, dataset the env id,
metric ``mean_reward`` with the value ``"<mean> +/- <std>"`` (built by
``huggingface_hub.repocard.metadata_eval_result``, as ``package_to_hub`` does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlstash.hub.extra import import_hub

LIBRARY = "rlstash"


def metadata(algo: str, env_id: str, mean_reward: float, std_reward: float) -> dict[str, Any]:
    """The card's YAML metadata (module docstring)."""
    hub = import_hub()
    meta: dict[str, Any] = {
        "library_name": LIBRARY,
        "tags": [env_id, "deep-reinforcement-learning", "reinforcement-learning", LIBRARY, algo],
    }
    meta.update(
        hub.repocard.metadata_eval_result(
            model_pretty_name=f"{algo.upper()}",
            task_pretty_name="reinforcement-learning",
            task_id="reinforcement-learning",
            metrics_pretty_name="mean_reward",
            metrics_id="mean_reward",
            metrics_value=f"{mean_reward:.2f} +/- {std_reward:.2f}",
            dataset_pretty_name=env_id,
            dataset_id=env_id,
        )
    )
    return meta


def text(repo_id: str, config: dict[str, Any], results: dict[str, Any], files: list[str]) -> str:
    """The card's Markdown below the metadata: what the agent is, how it scored, how to run it."""
    algo, env_id = config.get("algo", "?"), config.get("env", "?")
    lines = [
        f"# {algo.upper()} agent playing {env_id}",
        "",
        f"A {algo.upper()} agent trained on `{env_id}` with rlstash for "
        f"{results.get('train_steps', '?')} env steps.",
        "",
        "## Evaluation",
        "",
        f"mean_reward {results['mean_reward']:.2f} +/- {results['std_reward']:.2f} over "
        f"{results['n_eval_episodes']} episodes (deterministic actions, seeds from "
        f"{results['seed']}).",
        "",
        "## Usage",
        "",
        "```bash",
        "pip install 'rlstash[hub]'",
        f"rlstash eval hf://{repo_id}            # fetch (cached) and evaluate",
        f"rlstash pull {repo_id}                 # fetch only; prints the local directory",
        "```",
        "",
        "## Files",
        "",
        *(f"- `{name}`" for name in files),
        "",
        "## Settings",
        "",
        "```json",
        *_settings_lines(config),
        "```",
        "",
    ]
    return "\n".join(lines)


def _settings_lines(config: dict[str, Any]) -> list[str]:
    import json

    return json.dumps(config, indent=1, sort_keys=True, default=str).splitlines()


def write(path: Path, meta: dict[str, Any], body: str) -> Path:
    """``README.md`` at ``path``: ``body``, then ``meta`` saved as its YAML front matter by
    ``huggingface_hub.repocard.metadata_save`` (what ``package_to_hub`` does)."""
    hub = import_hub()
    path.write_text(body, encoding="utf-8")
    hub.repocard.metadata_save(path, meta)
    return path
