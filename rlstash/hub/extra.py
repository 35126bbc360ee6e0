"""The optional ``huggingface_hub`` package (``pip install 'rlstash[hub]'``), imported only
where a Hub feature is used."""

from __future__ import annotations

from typing import Any

HINT = "pip install 'rlstash[hub]'"


def import_hub() -> Any:
    """The ``huggingface_hub`` module, or a ValueError naming the install command."""
    try:
        import huggingface_hub
        import huggingface_hub.constants
        import huggingface_hub.errors
        import huggingface_hub.repocard
    except ImportError:
        raise ValueError(
            f"hub: huggingface_hub is not installed; install it with: {HINT}"
        ) from None
    return huggingface_hub
