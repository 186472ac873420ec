"""The inference service's engine names: what ``InferenceSettings.engine`` (``OPENFORGE_ENGINE``)
may name.

The inference service's engine registry checks at import that it registers exactly these, so
whoever starts the service (``openforge train``, ``openforge eval``) can refuse a misspelled
engine before anything starts.
"""

from __future__ import annotations

from typing import Final

#: Engine names the inference service serves with, sorted.
ENGINE_NAMES: Final[tuple[str, ...]] = ("scripted-oracle", "transformers", "vllm")
