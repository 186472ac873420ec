"""The ``verl`` backend: our store samples trained by veRL's (``verl==0.9.1``) own actor worker.

Each RL step does what veRL's ``ray_trainer`` does between rollout and weight sync:

1. the batch of :class:`TrainSample` becomes veRL's ``DataProto``
   (:func:`~openforge_trainer.backends.verl_batch.samples_to_dataproto`: left-padded prompts,
   right-padded responses, ``response_mask`` = our loss mask, ``rollout_log_probs`` = our
   behaviour logprobs, ``uid`` = group id);
2. advantages with veRL's outcome estimator: grpo/rloo on one row per rollout grouped by
   ``uid`` (each rollout once in its group's statistics, its advantage on all its samples),
   reinforce++ on ``token_level_rewards`` (:func:`~openforge_trainer.backends.verl_batch.compute_advantages`);
3. ``old_log_probs`` from the actor worker's ``infer_batch`` (``compute_log_prob``), and
   ``ref_log_prob`` from a forward-only reference worker when the KL loss is on;
   ``rollout_is_weights`` from veRL's ``compute_rollout_correction_weights`` (token TIS,
   "decoupled" mode);
4. the actor update: veRL's ``TrainingWorker.train_mini_batch`` (what
   ``ActorRolloutRefWorker.update_actor`` runs) on the ``left_right_2_no_padding`` TensorDict:
   epochs x mini-batches, dynamic micro-batches, the FSDP engine's forward/backward with
   ``ppo_loss``, clipping and the AdamW step;
5. checkpoints: veRL's checkpoint manager writes the HF model (moved to the checkpoint's root,
   which the loop hands to inference ``UpdateWeights``) and its optimizer state (``verl/``).

SFT steps run the same worker with veRL's ``sft_loss`` on the no-padding SFT layout.

Where the worker runs (:mod:`~openforge_trainer.backends.verl_worker`): in this process (one
device; on CPU through :mod:`~openforge_trainer.backends.verl_cpu`), or, with
``verl.distributed``, as veRL's Ray worker group of FSDP ``TrainingWorker`` over CUDA GPUs.
Field-by-field mapping and coverage: ``services/trainer/VERL.md``.
"""

from __future__ import annotations

import importlib
import shutil
import time
from pathlib import Path
from typing import Any, Final

import structlog

from openforge_core.errors import InvalidArgument
from openforge_core.run_config import RunConfig
from openforge_trainer.backends import hf_common, verl_batch, verl_cpu, verl_worker
from openforge_trainer.domain.samples import TrainBatch

log = structlog.get_logger(__name__)

#: The veRL version this backend's layout and config mapping were written against.
VERL_VERSION: Final = "0.9.1"

#: Our names → veRL's.
ADV_ESTIMATORS: Final = {"grpo": "grpo", "rloo": "rloo", "reinforce++": "reinforce_plus_plus"}
POLICY_LOSSES: Final = {"ppo-clip": "vanilla", "gspo": "gspo"}

#: Sub-directory of a checkpoint holding veRL's checkpoint manager's files (optimizer, extra).
VERL_STATE_DIR: Final = "verl"


def _reject(field: str, why: str) -> InvalidArgument:
    return InvalidArgument.field(field, f"the verl backend cannot express this: {why}")


def _validate(config: RunConfig) -> None:
    if config.groups_per_step % config.mini_batches:
        raise _reject(
            "mini_batches",
            f"veRL's ppo_mini_batch_size counts prompts (groups): groups_per_step={config.groups_per_step} "
            f"must be a multiple of mini_batches={config.mini_batches}",
        )
    if config.mode == "sft" and config.sft.lr_decay != "constant":
        raise _reject(
            "sft.lr_decay", "veRL's SFT step is one optimizer update; decay over passes needs the torch backend"
        )
    if config.max_grad_norm == 0:
        raise _reject("max_grad_norm", "veRL always clips the gradient norm (actor.optim.clip_grad); set a value > 0")
    if config.mode == "sft" and config.loss_agg_mode != "token-mean":
        raise _reject(
            "loss_agg_mode",
            f"veRL's sft_loss is a token mean over the batch; {config.loss_agg_mode!r} needs mode 'rl' or 'token-mean'",
        )
    if config.device != "cpu" and not config.device.startswith("cuda"):
        raise _reject("device", f"{config.device!r}: veRL trains on 'cuda' devices (or 'cpu' in-process)")
    if config.device == "cpu" and config.precision == "bf16":
        raise _reject("precision", "veRL's engine on CPU runs fp32 (no bf16 autocast there); use 'fp32' or 'auto'")
    v = config.verl
    if not v.distributed:
        if (v.n_gpus_per_node, v.nnodes) != (1, 1):
            raise _reject("verl.n_gpus_per_node", "more than one GPU needs verl.distributed: true")
        return
    if not config.device.startswith("cuda"):
        raise _reject("device", f"verl.distributed runs veRL's FSDP workers on CUDA GPUs, not {config.device!r}")
    world = v.n_gpus_per_node * v.nnodes
    per_mini = config.groups_per_step * config.group_size // config.mini_batches
    if per_mini % world:
        raise _reject(
            "verl.n_gpus_per_node",
            f"veRL splits each mini-batch evenly over the data-parallel ranks: {per_mini} rollouts per "
            f"mini-batch is not a multiple of {world} GPUs",
        )


def _model_settings(config: RunConfig) -> dict[str, Any]:
    """``actor_rollout_ref.model``: padding-free packed forward only with flash-attention (GPU)."""
    packed = config.device != "cpu" and verl_worker.has_flash_attention()
    settings: dict[str, Any] = {
        "path": config.model,
        "use_remove_padding": packed,
        "override_config": {"attn_implementation": "flash_attention_2" if packed else "sdpa"},
        "load_tokenizer": False,  # samples arrive as token ids; tokenizer files are copied
    }
    if config.gradient_checkpointing is not None:  # None: veRL's default
        settings["enable_gradient_checkpointing"] = config.gradient_checkpointing
    return settings


def verl_config(config: RunConfig) -> dict[str, Any]:
    """Maps a run config onto veRL's trainer config (the keys of ``ppo_trainer.yaml``).

    Field by field (also in ``services/trainer/VERL.md``); fields not listed are our loop's
    (tasks, harness, staleness, evaluation, pass@k) and never reach veRL.

    Raises:
        InvalidArgument: A setting veRL 0.9.1 (or this backend) cannot express (one field
            violation, named).
    """
    _validate(config)
    rollouts = config.groups_per_step * config.group_size
    mini_prompts = config.groups_per_step // config.mini_batches
    fsdp_config: dict[str, Any] = {}
    if config.device == "cpu":
        fsdp_config = verl_cpu.cpu_engine_overrides()
    elif config.precision != "auto":  # auto keeps veRL's GPU default: fp32 master, bf16 compute
        param = "bf16" if config.precision == "bf16" else "fp32"
        fsdp_config = {
            "model_dtype": "fp32",
            "mixed_precision": {"param_dtype": param, "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
        }
    return {
        "data": {"train_batch_size": config.groups_per_step},
        "algorithm": {
            "adv_estimator": ADV_ESTIMATORS[config.algorithm],
            "gamma": config.gamma,
            "norm_adv_by_std_in_grpo": config.norm_adv_by_std,
            "use_kl_in_reward": False,
            "rollout_correction": {"rollout_is": "token", "rollout_is_threshold": config.is_cap, "bypass_mode": False},
        },
        "actor_rollout_ref": {
            "model": _model_settings(config),
            "rollout": {"n": config.group_size, "temperature": config.temperature},
            "actor": {
                "strategy": config.verl.strategy,
                "fsdp_config": fsdp_config,
                "ppo_mini_batch_size": mini_prompts,
                "ppo_epochs": config.ppo_epochs,
                "shuffle": False,
                "data_loader_seed": config.seed,
                "use_dynamic_bsz": True,
                "ppo_max_token_len_per_gpu": config.micro_batch_tokens,
                "loss_agg_mode": config.loss_agg_mode,
                "policy_loss": {"loss_mode": POLICY_LOSSES[config.loss]},
                "clip_ratio": config.clip_ratio_low,
                "clip_ratio_low": config.clip_ratio_low,
                "clip_ratio_high": config.clip_ratio_high,
                "clip_ratio_c": config.clip_ratio_c,
                "entropy_coeff": config.entropy_coeff,
                "calculate_entropy": True,
                "use_kl_loss": config.kl_coef > 0,
                "kl_loss_coef": config.kl_coef,
                "kl_loss_type": config.kl_loss_type,
                "optim": {
                    "optimizer": "AdamW",
                    "lr": config.learning_rate,
                    "weight_decay": config.weight_decay,
                    "clip_grad": config.max_grad_norm,
                },
            },
        },
        "trainer": {
            "total_training_steps": config.steps,
            "device": "cpu" if config.device == "cpu" else "cuda",
            "n_gpus_per_node": config.verl.n_gpus_per_node,
            "nnodes": config.verl.nnodes,
        },
        "openforge": {
            "rollouts_per_step": rollouts,
            "mode": config.mode,
            "runner": "ray_worker_group" if config.verl.distributed else "in_process",
        },
    }


def actor_config(config: RunConfig) -> Any:
    """veRL ``ActorConfig`` built from :func:`verl_config`'s actor section (what ``ppo_loss``
    reads: loss mode, clip ratios, aggregation, entropy and KL settings)."""
    mapped = verl_config(config)["actor_rollout_ref"]["actor"]
    workers_config = importlib.import_module("verl.workers.config")
    rollouts = config.groups_per_step * config.group_size
    return workers_config.ActorConfig(
        strategy=mapped["strategy"],
        ppo_mini_batch_size=rollouts // config.mini_batches,
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=mapped["ppo_max_token_len_per_gpu"],
        rollout_n=config.group_size,
        ppo_epochs=mapped["ppo_epochs"],
        shuffle=False,
        data_loader_seed=mapped["data_loader_seed"],
        clip_ratio=mapped["clip_ratio"],
        clip_ratio_low=mapped["clip_ratio_low"],
        clip_ratio_high=mapped["clip_ratio_high"],
        clip_ratio_c=mapped["clip_ratio_c"],
        loss_agg_mode=mapped["loss_agg_mode"],
        policy_loss=workers_config.PolicyLossConfig(loss_mode=mapped["policy_loss"]["loss_mode"]),
        entropy_coeff=mapped["entropy_coeff"],
        calculate_entropy=True,
        use_kl_loss=mapped["use_kl_loss"],
        kl_loss_coef=mapped["kl_loss_coef"],
        kl_loss_type=mapped["kl_loss_type"],
    )


class VerlBackend:
    """An HF causal LM trained by veRL's actor worker on our store's samples.

    Args:
        config: The run config; rejected (``InvalidArgument``) when veRL cannot express it.

    Raises:
        InvalidArgument: See :func:`verl_config`.
        ImportError: torch, transformers or verl is not installed.
    """

    def __init__(self, config: RunConfig) -> None:
        import torch

        self._config = config
        self._mapped = verl_config(config)
        self._core_algos = importlib.import_module("verl.trainer.ppo.core_algos")
        self._rollout_corr = importlib.import_module("verl.trainer.ppo.rollout_corr_helper")
        self._cfg = actor_config(config)
        self._runner: Any = None
        self._model_dir: Path | None = None
        self._pad_token_id = 0
        torch.manual_seed(config.seed)

    @property
    def runner(self) -> Any:
        """The actor runner (:class:`~verl_worker.LocalActor` or :class:`~verl_worker.RayActorGroup`)."""
        if self._runner is None:
            raise RuntimeError("VerlBackend.load() was not called")
        return self._runner

    def load(self, model_dir: Path, checkpoint_dir: Path | None) -> None:
        """Builds veRL's actor worker on the weights of ``checkpoint_dir`` (else ``model_dir``)
        and restores the checkpoint's optimizer state; see the protocol.

        Raises:
            FailedPrecondition: ``verl.distributed`` on a machine without the CUDA GPUs it names.
        """
        from transformers import AutoConfig

        self._model_dir = model_dir
        source = checkpoint_dir or model_dir
        pad = getattr(AutoConfig.from_pretrained(str(source)), "pad_token_id", None)
        self._pad_token_id = int(pad) if isinstance(pad, int) else 0
        rl = self._config.mode == "rl"
        loss_fn = verl_worker.ppo_loss_fn(self._cfg) if rl else verl_worker.sft_loss_fn()
        ref = model_dir if rl and self._config.kl_coef > 0 else None
        v = self._config.verl
        if v.distributed:
            self._runner = verl_worker.RayActorGroup(
                self._mapped, source, ref, loss_fn, n_gpus_per_node=v.n_gpus_per_node, nnodes=v.nnodes
            )
        else:
            self._runner = verl_worker.LocalActor(self._mapped, source, ref, loss_fn, self._config.device)
        if checkpoint_dir is not None:
            self._runner.load(checkpoint_dir / VERL_STATE_DIR)
        log.info(
            "verl_backend.loaded",
            source=str(source),
            device=self._config.device,
            runner=self._mapped["openforge"]["runner"],
            verl=VERL_VERSION,
        )

    def state_dict(self) -> dict[str, Any]:
        """The actor's full parameters by HF name (in-process worker only)."""
        runner = self.runner
        if not isinstance(runner, verl_worker.LocalActor):
            raise RuntimeError(
                "state_dict() reads the in-process worker; the worker group's weights are in checkpoints"
            )
        return runner.state_dict()

    # ---- batch ----

    def to_dataproto(self, batch: TrainBatch) -> Any:
        """The batch in veRL's layout (on CPU: veRL's workers move their micro-batches)."""
        return verl_batch.samples_to_dataproto(
            batch.samples,
            pad_token_id=self._pad_token_id,
            temperature=self._config.temperature,
            policy_version=batch.policy_version,
        )

    def _padded(self, nested: Any, td: Any) -> Any:
        padding = importlib.import_module("verl.workers.utils.padding")
        return padding.no_padding_2_padding(nested, td).detach().float().cpu()

    def prepare_rl(self, data: Any) -> None:
        """Adds ``advantages``, ``old_log_probs``, ``rollout_is_weights`` (and ``ref_log_prob``),
        as ``ray_trainer`` does before ``update_actor``."""
        verl_batch.compute_advantages(
            self._core_algos,
            data,
            estimator=self._mapped["algorithm"]["adv_estimator"],
            gamma=self._config.gamma,
            norm_adv_by_std=self._config.norm_adv_by_std,
        )
        b = data.batch
        td = verl_worker.log_prob_tensordict(data)
        b["old_log_probs"] = self._padded(self.runner.compute_log_prob(td), td)
        if self._config.kl_coef > 0:
            td = verl_worker.log_prob_tensordict(data)
            b["ref_log_prob"] = self._padded(self.runner.compute_ref_log_prob(td), td)
        weights, is_metrics = self._rollout_corr.compute_rollout_correction_weights(
            log_ratio=b["old_log_probs"] - b["rollout_log_probs"],
            response_mask=b["response_mask"].float(),
            rollout_is="token",
            rollout_is_threshold=self._config.is_cap,
        )
        b["rollout_is_weights"] = weights
        data.meta_info["is_metrics"] = {k: float(v) for k, v in is_metrics.items()}

    # ---- protocol ----

    def train_rl(self, batch: TrainBatch) -> dict[str, float]:
        """One RL step (see the module docstring)."""
        started = time.perf_counter()
        data = self.to_dataproto(batch)
        self.prepare_rl(data)
        td = verl_worker.update_tensordict(
            data,
            mini_batch_size=len(data) // self._config.mini_batches,
            epochs=self._config.ppo_epochs,
            seed=self._config.seed,
            calculate_entropy=bool(self._mapped["actor_rollout_ref"]["actor"]["calculate_entropy"]),
        )
        raw = self.runner.update_actor(td)
        out = summarise(raw)
        out.update({"is/" + k.removeprefix("rollout_is_"): v for k, v in data.meta_info["is_metrics"].items()})
        out["loss/policy"] = out["loss/total"]
        out.update(hf_common.throughput(batch, time.perf_counter() - started))
        return out

    def train_sft(self, batch: TrainBatch) -> dict[str, float]:
        """One SFT step: veRL's ``sft_loss`` on the loss-mask tokens, one optimizer update."""
        started = time.perf_counter()
        data = self.to_dataproto(batch)
        out = summarise(self.runner.update_actor(verl_worker.sft_tensordict(data)))
        out["loss/sft"] = out["loss/total"]
        out.update(hf_common.throughput(batch, time.perf_counter() - started))
        return out

    def save_checkpoint(self, directory: Path) -> None:
        """veRL's checkpoint manager writes the HF model (moved to ``directory``: config,
        ``model.safetensors``) and its optimizer/extra state (``directory/verl``); the model
        directory's other files (tokenizer, chat template) are copied."""
        state = directory / VERL_STATE_DIR
        self.runner.save(state)
        hf = state / "huggingface"
        for path in sorted(hf.iterdir()):
            shutil.move(str(path), str(directory / path.name))
        hf.rmdir()
        if self._model_dir is not None:
            for path in sorted(self._model_dir.iterdir()):
                own = path.suffix in (".safetensors", ".bin") or path.name in hf_common.MODEL_FILES
                if path.is_file() and not own and not (directory / path.name).exists():
                    shutil.copy2(path, directory / path.name)

    def close(self) -> None:
        """Releases veRL's workers."""
        if self._runner is not None:
            self._runner.close()
        self._runner = None


def _floats(value: Any) -> list[float]:
    """The numbers of one of veRL's metric entries (a number, a list, or a ``Metric``)."""
    values = getattr(value, "values", None)
    if isinstance(values, list):
        return [float(x) for x in values]
    if isinstance(value, (list, tuple)):
        return [f for v in value for f in _floats(v)]
    return [float(value)]


def summarise(metrics: dict[str, Any]) -> dict[str, float]:
    """veRL's ``train_mini_batch`` metrics (one entry per mini-batch update) → our metric names.

    ``loss`` → ``loss/total`` (mean over the updates), ``grad_norm`` (mean), ``lr``; ``actor/*``
    kept (mean); veRL's memory/MFU figures under ``perf/``.
    """
    out: dict[str, float] = {}
    for key, value in metrics.items():
        numbers = _floats(value)
        if not numbers:
            continue
        mean = sum(numbers) / len(numbers)
        if key == "loss":
            out["loss/total"] = mean
        elif key in ("grad_norm", "lr"):
            out[key] = mean
        elif key == "mfu":
            out["perf/mfu"] = mean
        else:
            out[key if "/" in key else "actor/" + key] = mean
    return out
