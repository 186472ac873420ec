"""veRL's engine on CPU, in one process: what veRL 0.9.1 lacks there, supplied through its own
extension points, each named here.

veRL 0.9.1 picks its device through a platform registry (``verl.plugin.platform``) that ships
CUDA, ROCm and NPU platforms only: on a machine without an accelerator it falls back to the CUDA
platform, and its FSDP engine (``FSDPEngineWithLMHead``) is registered for devices ``cuda`` and
``npu`` only. To run veRL's own actor worker (``TrainingWorker``: mini-batch loop, FSDP engine
forward/backward, ``ppo_loss``, clipping, optimizer step) on CPU:

* :class:`CPUPlatform` is installed with ``verl.plugin.platform.set_platform`` (veRL's documented
  override): device ``cpu``, collectives over ``gloo``, memory statistics reported as 0;
* veRL's ``FSDPEngineWithLMHead`` is registered for device ``cpu`` in ``EngineRegistry``
  (the class itself, unchanged);
* the one-rank process group is a ``gloo`` group on an in-process ``HashStore`` (no port).

Everything else (the engine, the worker, the losses) is veRL's code as it runs on GPUs. What the
backend sets differently on CPU is in :func:`cpu_engine_overrides`.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType, SimpleNamespace
from typing import Any, Final

#: Settings of veRL's FSDP engine (``actor.fsdp_config``) that differ on CPU (and why). (The
#: model side, ``use_remove_padding: false`` with SDPA attention, is set by ``verl_config``:
#: without flash-attention the engine pads each micro-batch instead of packing the sequences.)
CPU_ENGINE_OVERRIDES: Final[dict[str, Any]] = {
    # fp32 weights and no autocast: CPU autocast is bf16, which would not match the torch backend
    "model_dtype": "fp32",
    "mixed_precision": {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
    # torch.compile of the entropy kernel needs a C++ toolchain at run time; plain torch here
    "use_torch_compile": False,
}

_lock = threading.Lock()
_installed = False


def cpu_engine_overrides() -> dict[str, Any]:
    """A copy of :data:`CPU_ENGINE_OVERRIDES`."""
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in CPU_ENGINE_OVERRIDES.items()}


def _cpu_device_module() -> Any:
    """The ``torch.cuda``-shaped module veRL calls through ``get_torch_device()``, for CPU."""
    import torch

    def zero(*_args: Any, **_kwargs: Any) -> int:
        return 0

    def nothing(*_args: Any, **_kwargs: Any) -> None:
        return None

    return SimpleNamespace(
        is_available=lambda: True,
        current_device=lambda: "cpu",
        device_count=lambda: 1,
        get_device_name=lambda *_a: "CPU",
        set_device=nothing,
        synchronize=nothing,
        empty_cache=nothing,
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
        get_rng_state=torch.get_rng_state,
        set_rng_state=torch.set_rng_state,
        memory_allocated=zero,
        memory_reserved=zero,
        max_memory_allocated=zero,
        max_memory_reserved=zero,
        reset_peak_memory_stats=nothing,
        mem_get_info=lambda *_a, **_k: (0, 0),
        Stream=torch.cpu.Stream,
        stream=torch.cpu.stream,
        current_stream=torch.cpu.current_stream,
        Event=torch.cpu.Event,
    )


def _platform_class() -> type[Any]:
    base: Any = importlib.import_module("verl.plugin.platform.platform_base").PlatformBase

    class CPUPlatform(base):  # type: ignore[misc]
        """veRL platform for a CPU-only process: device ``cpu``, ``gloo`` collectives."""

        _module = _cpu_device_module()

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> Any:
            return self._module

        def is_available(self) -> bool:
            return True

        def current_device(self) -> Any:
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            import torch

            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            self.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str) -> Iterator[None]:
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> Any:
            return None

    return CPUPlatform


def install(device: str = "cpu") -> None:
    """Prepares this process for veRL's engine on ``device`` (idempotent).

    ``cpu``: installs :class:`CPUPlatform` and registers ``FSDPEngineWithLMHead`` for device
    ``cpu`` (see the module docstring). ``cuda[:i]``: veRL's own CUDA platform; selects GPU ``i``.
    Then starts a one-rank process group (``gloo`` on CPU, ``cpu:gloo,cuda:nccl`` on CUDA, as
    veRL's workers use) on an in-process store, unless one is running, and sets the rank layout
    veRL's ``Worker`` reads from the environment (one rank) where it is not set.

    Raises:
        RuntimeError: A process group of more than one rank is already running here, or veRL's
            platform was already chosen for another device in this process.
        ImportError: veRL's engine dependencies (``peft``, ``accelerate``) are not installed.
    """
    global _installed
    import torch
    import torch.distributed as dist

    from openforge_trainer.backends import verl_batch

    verl_batch.load_verl_losses()  # before veRL's engine modules: see its docstring
    on_cpu = device == "cpu"
    with _lock:
        if not _installed:
            manager: Any = importlib.import_module("verl.plugin.platform.platform_manager")
            if on_cpu:
                manager.set_platform(_platform_class()())
                engine: ModuleType = importlib.import_module("verl.workers.engine")
                registry: Any = engine.EngineRegistry
                registry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(
                    engine.FSDPEngineWithLMHead
                )
            elif torch.device(device).index is not None:
                torch.cuda.set_device(torch.device(device))
            _installed = True
        name = importlib.import_module("verl.utils.device").get_device_name()
        if name != ("cpu" if on_cpu else "cuda"):
            raise RuntimeError(f"veRL runs on {name!r} in this process; the verl backend asked for {device!r}")
        if dist.is_initialized():
            if dist.get_world_size() != 1:
                raise RuntimeError(
                    "the verl backend's in-process worker needs a one-rank process group, "
                    f"found world size {dist.get_world_size()}"
                )
        else:
            backend = "gloo" if on_cpu else "cpu:gloo,cuda:nccl"
            store: Any = importlib.import_module("torch.distributed").HashStore()
            dist.init_process_group(backend, store=store, rank=0, world_size=1)
        # veRL's Worker base class reads its rank layout from the environment (its Ray launcher
        # sets it); one rank, no rendezvous (the group above is already up).
        for key, value in {
            "WORLD_SIZE": "1",
            "RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "0",
        }.items():
            os.environ.setdefault(key, value)
