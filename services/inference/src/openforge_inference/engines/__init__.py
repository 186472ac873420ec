"""Generation engines behind one :class:`~openforge_inference.engines.base.Engine` protocol, with a
lazy name → implementation registry: the heavy module (vllm, transformers/torch) is imported only
when its engine is created."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from openforge_core.engine_names import ENGINE_NAMES
from openforge_core.registry import LazyRegistry, UnknownName
from openforge_inference.engines.base import Engine, EngineConfig

__all__ = ["check_registry", "create_engine"]

_REGISTRY: Final = LazyRegistry(
    "engine",
    {
        "vllm": "openforge_inference.engines.vllm_engine:VllmEngine",
        "transformers": "openforge_inference.engines.transformers_engine:TransformersEngine",
        "scripted-oracle": "openforge_inference.engines.scripted_oracle:ScriptedOracleEngine",
    },
)


def check_registry(registry: Iterable[str]) -> None:
    """Checks that ``registry`` registers exactly the engine names of the contract
    (:data:`openforge_core.engine_names.ENGINE_NAMES`, which the CLI checks names against).

    Raises:
        RuntimeError: A name is missing from the registry or from the contract.
    """
    if sorted(registry) != sorted(ENGINE_NAMES):
        raise RuntimeError(
            f"engine registry {sorted(registry)} differs from openforge_core.engine_names.ENGINE_NAMES "
            f"{list(ENGINE_NAMES)}"
        )


check_registry(_REGISTRY)


def create_engine(name: str, config: EngineConfig) -> Engine:
    """Builds (does not start) the engine registered under ``name``.

    Args:
        name: ``"vllm"``, ``"transformers"`` or ``"scripted-oracle"`` (a scripted engine that
            replays task oracles, for recording demonstrations; not a model).
        config: Model path and engine options.

    Returns:
        The engine; call ``await engine.start()`` before serving.

    Raises:
        ValueError: Unknown engine name.
        ImportError: The engine's libraries are not installed
            (see requirements/inference-cpu.txt).
    """
    try:
        cls = _REGISTRY.load(name)
    except UnknownName as exc:
        raise ValueError(str(exc)) from None
    engine: Engine = cls(config)
    return engine
