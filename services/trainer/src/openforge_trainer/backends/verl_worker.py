"""veRL's actor worker driven with our batches: in this process, or as veRL's Ray worker group.

veRL 0.9.1's actor is ``verl.workers.engine_workers.TrainingWorker`` (what
``ActorRolloutRefWorker`` wraps for its actor and reference roles): its FSDP engine runs the
forward/backward over micro-batches, ``workers.utils.losses.ppo_loss`` (or ``sft_loss``),
gradient clipping and the AdamW step; ``train_mini_batch`` is the whole actor update of
``ActorRolloutRefWorker.update_actor``; ``infer_batch`` is ``compute_log_prob`` /
``compute_ref_log_prob``. (0.9.1 no longer ships the older ``DataParallelPPOActor``.)

Two runners with one interface (:class:`ActorRunner`):

* :class:`LocalActor`: one ``TrainingWorker`` (and one forward-only reference worker when the
  KL loss is on) in this process, world size 1: on CPU (with :mod:`verl_cpu`'s platform) or
  on one GPU;
* :class:`RayActorGroup`: ``RayWorkerGroup`` of ``TrainingWorker`` over
  ``n_gpus_per_node x nnodes`` GPUs (veRL's own pattern, ``trainer/sft_trainer_ray.py``),
  the batch dispatched over the data-parallel ranks by veRL. Needs CUDA: construction fails with
  ``FailedPrecondition`` on a machine without enough GPUs.

Both receive the TensorDict that ``ray_trainer`` hands to its worker group
(:func:`update_tensordict`, :func:`log_prob_tensordict`).
"""

from __future__ import annotations

import importlib
import importlib.util
from functools import partial
from pathlib import Path
from typing import Any, Final, Protocol

import structlog

from openforge_core.errors import FailedPrecondition

log = structlog.get_logger(__name__)

#: What veRL's checkpoint manager writes: the optimizer and extra state (LR scheduler, RNG) per
#: rank, and the full model as HF safetensors (``huggingface/``), which becomes our checkpoint.
CHECKPOINT_SAVE: Final = ("optimizer", "extra", "hf_model")
#: What a resume reads back through veRL (the weights come from the HF files).
CHECKPOINT_LOAD: Final = ("optimizer", "extra")


def _tu() -> Any:
    return importlib.import_module("verl.utils.tensordict_utils")


def has_flash_attention() -> bool:
    """Whether ``flash_attn`` is installed (veRL's packed, padding-free forward needs it)."""
    return importlib.util.find_spec("flash_attn") is not None


def engine_settings(mapped: dict[str, Any]) -> dict[str, Any]:
    """The settings of veRL's model, engine and optimizer configs, from :func:`verl_config`'s tree.

    Returns:
        ``{"model": {...HFModelConfig fields}, "engine": {...FSDPEngineConfig fields},
        "optim": {...FSDPOptimizerConfig fields}}``.
    """
    actor = mapped["actor_rollout_ref"]["actor"]
    model = mapped["actor_rollout_ref"]["model"]
    engine = {
        "strategy": actor["strategy"],
        "use_dynamic_bsz": actor["use_dynamic_bsz"],
        "max_token_len_per_gpu": actor["ppo_max_token_len_per_gpu"],
        "infer_max_token_len_per_gpu": actor["ppo_max_token_len_per_gpu"],
        "seed": actor["data_loader_seed"],
        **actor["fsdp_config"],
    }
    optim = {k: v for k, v in actor["optim"].items() if k != "optimizer"}
    optim["optimizer"] = actor["optim"]["optimizer"]
    return {"model": dict(model), "engine": engine, "optim": optim}


def training_worker_config(mapped: dict[str, Any], model_path: Path, *, forward_only: bool = False) -> Any:
    """veRL's ``TrainingWorkerConfig`` of the actor (or, ``forward_only``, the reference model).

    Args:
        mapped: :func:`~openforge_trainer.backends.verl_backend.verl_config`'s tree.
        model_path: HF model directory the worker loads (the run's model or a checkpoint).
        forward_only: The reference worker: no optimizer, parameters frozen.
    """
    workers_config: Any = importlib.import_module("verl.workers.config")
    trainer_config: Any = importlib.import_module("verl.trainer.config")
    settings = engine_settings(mapped)
    model_fields = {k: v for k, v in settings["model"].items() if k != "path"}
    model = workers_config.HFModelConfig(path=str(model_path), **model_fields)
    engine = workers_config.FSDPEngineConfig(forward_only=forward_only, **settings["engine"])
    optim = None if forward_only else workers_config.FSDPOptimizerConfig(**settings["optim"])
    return workers_config.TrainingWorkerConfig(
        model_type="language_model",
        model_config=model,
        engine_config=engine,
        optimizer_config=optim,
        checkpoint_config=trainer_config.CheckpointConfig(
            save_contents=list(CHECKPOINT_SAVE), load_contents=list(CHECKPOINT_LOAD)
        ),
    )


def log_prob_tensordict(data: Any) -> Any:
    """``ray_trainer._compute_old_log_prob``'s hand-off: ``to_tensordict`` +
    ``left_right_2_no_padding`` + ``compute_loss=False``."""
    padding = importlib.import_module("verl.workers.utils.padding")
    td = padding.left_right_2_no_padding(data.to_tensordict())
    _tu().assign_non_tensor(td, calculate_entropy=False, compute_loss=False)
    return td


def update_tensordict(data: Any, *, mini_batch_size: int, epochs: int, seed: int, calculate_entropy: bool) -> Any:
    """``ray_trainer._update_actor``'s hand-off to ``update_actor`` (mini-batch size in rollouts,
    the store's order kept: ``shuffle`` off)."""
    padding = importlib.import_module("verl.workers.utils.padding")
    td = padding.left_right_2_no_padding(data.to_tensordict())
    _tu().assign_non_tensor(
        td,
        calculate_entropy=calculate_entropy,
        global_batch_size=mini_batch_size,
        mini_batch_size=mini_batch_size,
        epochs=epochs,
        seed=seed,
        dataloader_kwargs={"shuffle": False},
        compute_loss=True,
    )
    return td


def sft_tensordict(data: Any) -> Any:
    """The batch in veRL's SFT layout (``pad_mode`` no-padding): one nested row per sequence,
    ``loss_mask`` over the whole sequence (0 on the prompt, our loss mask on the response), which
    ``sft_loss`` shifts by one token onto the log-probs; one mini-batch of the whole batch."""
    import torch

    padding = importlib.import_module("verl.workers.utils.padding")
    td = padding.left_right_2_no_padding(data.to_tensordict())
    attention = data.batch["attention_mask"].bool()
    full_mask = torch.cat([torch.zeros_like(data.batch["prompts"]), data.batch["response_mask"]], dim=1)
    rows = [full_mask[i][attention[i]] for i in range(len(data))]
    td["loss_mask"] = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    n = len(data)
    _tu().assign_non_tensor(
        td,
        global_batch_size=n,
        mini_batch_size=n,
        epochs=1,
        seed=0,
        dataloader_kwargs={"shuffle": False},
    )
    return td


class ActorRunner(Protocol):
    """What the backend asks of veRL's actor, wherever it runs."""

    def compute_log_prob(self, td: Any) -> Any:
        """``log_probs`` (nested, veRL's no-padding layout) of the actor."""
        ...

    def compute_ref_log_prob(self, td: Any) -> Any:
        """``log_probs`` of the reference model (the run's initial model)."""
        ...

    def update_actor(self, td: Any) -> dict[str, Any]:
        """``train_mini_batch``: every epoch and mini-batch; returns veRL's metrics lists."""
        ...

    def save(self, directory: Path) -> None:
        """veRL's checkpoint manager into ``directory``: optimizer and extra (scheduler, RNG)
        state per rank, and the full model as HF safetensors in ``directory/huggingface``."""
        ...

    def load(self, directory: Path) -> None:
        """Restores what :meth:`save` wrote."""
        ...

    def close(self) -> None:
        """Releases the workers."""
        ...


def metrics_of(output: Any) -> dict[str, Any]:
    """The ``metrics`` a ``TrainingWorker`` call returned (veRL's lists, one entry per update)."""
    metrics = _tu().get(output, "metrics")
    return dict(metrics) if metrics is not None else {}


class LocalActor:
    """veRL's ``TrainingWorker`` in this process (world size 1).

    Args:
        mapped: :func:`verl_config`'s tree.
        model_path: HF weights the actor starts from.
        ref_path: HF weights of the reference model (None: no reference worker).
        loss_fn: ``partial(ppo_loss, config=ActorConfig)`` or ``partial(sft_loss, config=None)``.
        device: ``cpu`` (installs :mod:`verl_cpu`) or ``cuda``.

    Raises:
        ImportError: veRL's engine dependencies (peft, accelerate) are missing.
    """

    def __init__(self, mapped: dict[str, Any], model_path: Path, ref_path: Path | None, loss_fn: Any, device: str):
        from openforge_trainer.backends import verl_cpu

        verl_cpu.install(device)
        engine_workers: Any = importlib.import_module("openforge_trainer.backends.verl_remote")
        self._actor = engine_workers.TrainingWorker(training_worker_config(mapped, model_path))
        self._actor.reset()
        self._actor.set_loss_fn(loss_fn)
        self._ref: Any = None
        if ref_path is not None:
            # veRL's forward-only engine offloads the reference to pinned CPU memory, which needs an
            # accelerator; on CPU the reference is a regular engine only ever called by infer_batch
            forward_only = device != "cpu"
            ref_config = training_worker_config(mapped, ref_path, forward_only=forward_only)
            self._ref = engine_workers.TrainingWorker(ref_config)
            self._ref.reset()

    @property
    def worker(self) -> Any:
        """The actor's ``TrainingWorker``."""
        return self._actor

    def compute_log_prob(self, td: Any) -> Any:
        return _tu().get(self._actor.infer_batch(td), "log_probs")

    def compute_ref_log_prob(self, td: Any) -> Any:
        if self._ref is None:
            raise RuntimeError("no reference worker (kl_coef is 0)")
        return _tu().get(self._ref.infer_batch(td), "log_probs")

    def update_actor(self, td: Any) -> dict[str, Any]:
        return metrics_of(self._actor.train_mini_batch(td))

    def state_dict(self) -> dict[str, Any]:
        """Full parameters by HF name, on CPU (veRL's ``get_per_tensor_param``, what its weight
        sync to the rollout engine sends)."""
        params, _peft = self._actor.engine.get_per_tensor_param()
        return {name: tensor.detach().to("cpu").clone() for name, tensor in params}

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._actor.save_checkpoint(str(directory))

    def load(self, directory: Path) -> None:
        self._actor.load_checkpoint(str(directory))

    def close(self) -> None:
        self._actor = None
        self._ref = None


def check_gpus(n_gpus_per_node: int, nnodes: int) -> None:
    """Fails unless this machine can host veRL's FSDP worker group.

    Raises:
        FailedPrecondition: No CUDA, or fewer local GPUs than ``n_gpus_per_node`` (single node).
    """
    import torch

    if not torch.cuda.is_available():
        raise FailedPrecondition(
            "verl.distributed: veRL's Ray worker group runs one FSDP TrainingWorker per CUDA GPU "
            "(NCCL collectives, CUDA placement groups) and this machine has no CUDA device; "
            "train on one device in-process instead (verl.distributed: false)"
        )
    if nnodes == 1 and torch.cuda.device_count() < n_gpus_per_node:
        raise FailedPrecondition(
            f"verl.distributed: n_gpus_per_node={n_gpus_per_node} but this machine has "
            f"{torch.cuda.device_count()} CUDA device(s)"
        )


def resource_pool_spec(n_gpus_per_node: int, nnodes: int) -> dict[str, Any]:
    """Arguments of veRL's ``RayResourcePool`` for the worker group (as ``sft_trainer_ray``)."""
    return {"process_on_nodes": [n_gpus_per_node] * nnodes, "use_gpu": True, "max_colocate_count": 2}


class RayActorGroup:
    """veRL's ``RayWorkerGroup`` of ``TrainingWorker`` (one per GPU, FSDP over all of them).

    Starts (or, ``nnodes > 1``, joins with ``address="auto"``) a Ray cluster; the actor group and,
    with the KL loss, a forward-only reference group colocated on the same placement groups.

    Raises:
        FailedPrecondition: See :func:`check_gpus`.
    """

    def __init__(
        self,
        mapped: dict[str, Any],
        model_path: Path,
        ref_path: Path | None,
        loss_fn: Any,
        *,
        n_gpus_per_node: int,
        nnodes: int,
    ) -> None:
        check_gpus(n_gpus_per_node, nnodes)
        ray: Any = importlib.import_module("ray")
        single: Any = importlib.import_module("verl.single_controller.ray")
        engine_workers: Any = importlib.import_module("openforge_trainer.backends.verl_remote")
        if not ray.is_initialized():
            ray.init(address="auto" if nnodes > 1 else None, include_dashboard=False)
        self._pool = single.RayResourcePool(**resource_pool_spec(n_gpus_per_node, nnodes))
        remote = ray.remote(engine_workers.TrainingWorker)
        self._actor = single.RayWorkerGroup(
            resource_pool=self._pool,
            ray_cls_with_init=single.RayClassWithInitArgs(remote, config=training_worker_config(mapped, model_path)),
            device_name="cuda",
        )
        self._actor.set_loss_fn(loss_fn=loss_fn)
        self._actor.reset()
        self._ref: Any = None
        if ref_path is not None:
            ref_config = training_worker_config(mapped, ref_path, forward_only=True)
            self._ref = single.RayWorkerGroup(
                resource_pool=self._pool,
                ray_cls_with_init=single.RayClassWithInitArgs(remote, config=ref_config),
                device_name="cuda",
            )
            self._ref.reset()
        log.info("verl_backend.worker_group", gpus=n_gpus_per_node * nnodes, ref=ref_path is not None)

    @staticmethod
    def _get(result: Any) -> Any:
        return result.get() if hasattr(result, "get") else result

    def compute_log_prob(self, td: Any) -> Any:
        return _tu().get(self._get(self._actor.infer_batch(td)), "log_probs")

    def compute_ref_log_prob(self, td: Any) -> Any:
        if self._ref is None:
            raise RuntimeError("no reference worker group (kl_coef is 0)")
        return _tu().get(self._get(self._ref.infer_batch(td)), "log_probs")

    def update_actor(self, td: Any) -> dict[str, Any]:
        return metrics_of(self._get(self._actor.train_mini_batch(td)))

    def save(self, directory: Path) -> None:
        self._actor.save_checkpoint(str(directory))

    def load(self, directory: Path) -> None:
        self._actor.load_checkpoint(str(directory))

    def close(self) -> None:
        self._actor = None
        self._ref = None


def sft_loss_fn() -> Any:
    """``partial(sft_loss, config=None)``, as veRL's SFT trainer sets it."""
    from openforge_trainer.backends import verl_batch

    return partial(verl_batch.load_verl_losses().sft_loss, config=None)


def ppo_loss_fn(actor_config: Any) -> Any:
    """``partial(ppo_loss, config=actor_config)``, as ``ActorRolloutRefWorker.init_model`` sets it."""
    from openforge_trainer.backends import verl_batch

    return partial(verl_batch.load_verl_losses().ppo_loss, config=actor_config)
