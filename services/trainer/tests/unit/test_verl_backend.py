"""The ``verl`` backend on CPU against the ``torch`` backend, and its config mapping.

What runs here is veRL's own actor: ``TrainingWorker`` (``train_mini_batch`` = the actor
update of ``ActorRolloutRefWorker.update_actor``; ``infer_batch`` = ``compute_log_prob``) with
its FSDP2 engine on a one-rank gloo group, ``ppo_loss``/``sft_loss``, clipping, AdamW and its
checkpoint manager; veRL's advantage estimators and ``compute_rollout_correction_weights``.
What differs on CPU (and is explicit in ``verl_cpu``): veRL's CPU platform is ours, the engine
pads micro-batches instead of packing them (no flash-attention), fp32 without autocast. Left to
``tools/gpu/verl_check.py``: the engine on CUDA (bf16 autocast, packed flash-attention varlen),
the Ray worker group, vLLM sampling.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import pytest

from openforge_core.errors import InvalidArgument
from openforge_core.run_config import RunConfig
from openforge_trainer.domain.samples import TrainBatch, TrainSample

BASE: dict[str, Any] = {"model": "m", "tasks": ["t"], "group_size": 3, "groups_per_step": 2}


def cfg(**over: Any) -> RunConfig:
    return RunConfig.model_validate({**BASE, **over})


def rl_samples(model: Any, seed: int = 0, *, vocab: int = 64) -> list[TrainSample]:
    """Two groups of three, tool spans inside responses, behaviour logprobs = the model's own
    logprobs plus noise (so the truncated IS weights are neither 1 nor all capped)."""
    import torch

    rng = random.Random(seed)
    out: list[TrainSample] = []
    for g in ("g0", "g1"):
        for i in range(3):
            prompt = [rng.randrange(2, vocab) for _ in range(rng.randint(2, 7))]
            mask = [1] * rng.randint(1, 4) + [0] * rng.randint(1, 2) + [1] * rng.randint(1, 4)
            response = [rng.randrange(2, vocab) for _ in mask]
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([prompt + response])).logits[0]
            logp = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), -1)
            own = logp.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1).tolist()
            out.append(
                TrainSample(
                    sample_id=f"{g}-{i}/0",
                    rollout_id=f"{g}-{i}",
                    group_id=g,
                    task_id="t",
                    prompt_ids=tuple(prompt),
                    response_ids=tuple(response),
                    loss_mask=tuple(mask),
                    behaviour_logprobs=tuple(
                        lp + rng.uniform(-0.8, 0.8) if m else 0.0 for lp, m in zip(own, mask, strict=True)
                    ),
                    policy_versions=tuple(1 if m else 0 for m in mask),
                    reward=float(rng.randint(0, 2)) / 2,
                )
            )
    return out


def _params(model: Any) -> dict[str, Any]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


CASES = [
    pytest.param({}, id="grpo-ppo-clip-token-mean"),
    pytest.param({"loss": "gspo", "loss_agg_mode": "seq-mean-token-mean"}, id="gspo-seq-mean"),
    pytest.param({"algorithm": "rloo", "entropy_coeff": 0.01, "kl_coef": 0.1}, id="rloo-entropy-kl"),
    pytest.param({"algorithm": "reinforce++", "mini_batches": 2, "ppo_epochs": 2}, id="rpp-4-updates"),
    pytest.param({"micro_batch_tokens": 24, "temperature": 0.8, "norm_adv_by_std": False}, id="micro-batches"),
]


@pytest.mark.parametrize("over", CASES)
def test_rl_step_equals_the_torch_backend(micro_model_dir: Path, over: dict[str, Any]) -> None:
    """Same batch, same initial weights: the loss of every update and the weights after the step
    match the torch backend's (which tests its formulas against hand-written references)."""
    import torch
    from transformers import AutoModelForCausalLM

    from openforge_trainer.backends.torch_backend import TorchBackend
    from openforge_trainer.backends.verl_backend import VerlBackend

    config = cfg(learning_rate=1e-2, **over)
    ours, theirs = TorchBackend(config), VerlBackend(config)
    ours.load(micro_model_dir, None)
    theirs.load(micro_model_dir, None)
    batch = TrainBatch(samples=tuple(rl_samples(ours.model)), policy_version=1)

    m_torch = ours.train_rl(batch)
    m_verl = theirs.train_rl(batch)

    assert m_verl["loss/total"] == pytest.approx(m_torch["loss/total"], rel=1e-4, abs=1e-6)
    assert m_verl["grad_norm"] == pytest.approx(m_torch["grad_norm"], rel=1e-4, abs=1e-6)
    a, b = _params(ours.model), theirs.state_dict()
    # veRL exports the tied output projection under its own name too
    assert set(b) - set(a) <= {"lm_head.weight"} and set(a) <= set(b)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=k)
    # the step moved the weights (the comparison is not trivially between two unchanged models)
    init = _params(AutoModelForCausalLM.from_pretrained(str(micro_model_dir), dtype=torch.float32))
    assert any(not torch.equal(b[k], v) for k, v in init.items())
    theirs.close()


def test_ppo_loss_of_one_batch_equals_torch_backend_objective(micro_model_dir: Path) -> None:
    """veRL's worker computing ``ppo_loss`` on the converted batch (``infer_batch`` with the loss,
    no update) equals the torch backend's ``policy_objective`` on its own padding of the samples."""
    import torch

    from openforge_trainer.backends import verl_worker
    from openforge_trainer.backends.torch_backend import TorchBackend, collate, compute_advantages, policy_objective
    from openforge_trainer.backends.verl_backend import VerlBackend, summarise

    config = cfg(is_cap=1.5)
    ours, theirs = TorchBackend(config), VerlBackend(config)
    ours.load(micro_model_dir, None)
    theirs.load(micro_model_dir, None)
    samples = rl_samples(ours.model, seed=4)

    data = theirs.to_dataproto(TrainBatch(samples=tuple(samples), policy_version=1))
    theirs.prepare_rl(data)
    td = verl_worker.update_tensordict(data, mini_batch_size=len(data), epochs=1, seed=0, calculate_entropy=True)
    out = theirs.runner.worker.infer_batch(td)
    verl_metrics = summarise(verl_worker.metrics_of(out))  # one micro-batch: the values themselves

    mb = collate(samples, range(len(samples)), torch.device("cpu"))
    adv = compute_advantages(ours._verl, config, samples)
    ours._set_batch_info([mb])
    with torch.no_grad():
        log_prob, _ = ours._log_prob(ours.model, mb)
        torch_loss, torch_metrics, _w = policy_objective(
            ours._verl,
            ours._cfg,
            loss_name="vanilla",
            log_prob=log_prob,
            old_log_prob=log_prob,
            behaviour_log_prob=mb.behaviour,
            advantages=adv[:, : mb.labels.shape[1]],
            mask=mb.mask,
            is_cap=1.5,
        )
    assert verl_metrics["loss/total"] == pytest.approx(float(torch_loss), rel=1e-5, abs=1e-7)
    torch.testing.assert_close(data.batch["advantages"].float(), adv[:, : data.batch["advantages"].shape[1]])
    assert verl_metrics["actor/pg_clipfrac"] == pytest.approx(torch_metrics["actor/pg_clipfrac"], abs=1e-6)
    theirs.close()


def test_sft_step_equals_the_torch_backend(micro_model_dir: Path) -> None:
    import torch

    from openforge_trainer.backends.torch_backend import TorchBackend
    from openforge_trainer.backends.verl_backend import VerlBackend

    config = cfg(mode="sft", learning_rate=1e-2, micro_batch_tokens=30)
    ours, theirs = TorchBackend(config), VerlBackend(config)
    ours.load(micro_model_dir, None)
    theirs.load(micro_model_dir, None)
    batch = TrainBatch(samples=tuple(rl_samples(ours.model, seed=5)), policy_version=0)
    m_torch, m_verl = ours.train_sft(batch), theirs.train_sft(batch)
    assert m_verl["loss/sft"] == pytest.approx(m_torch["loss/sft"], rel=1e-5)
    assert m_verl["grad_norm"] == pytest.approx(m_torch["grad_norm"], rel=1e-4)
    got = theirs.state_dict()
    for k, v in _params(ours.model).items():
        torch.testing.assert_close(got[k], v, rtol=1e-4, atol=1e-5, msg=k)
    theirs.close()


def test_checkpoint_is_hf_and_resumes_exactly(micro_model_dir: Path, tmp_path: Path) -> None:
    """A checkpoint is a loadable HF model (the weights ``UpdateWeights`` reads) plus veRL's
    optimizer state: a resumed backend's next step equals the uninterrupted backend's."""
    import torch
    from transformers import AutoModelForCausalLM

    from openforge_trainer.backends.base import create_backend
    from openforge_trainer.backends.verl_backend import VerlBackend

    config = cfg(backend="verl", learning_rate=1e-2)
    backend = create_backend("verl", config)
    assert isinstance(backend, VerlBackend)
    backend.load(micro_model_dir, None)
    reference = AutoModelForCausalLM.from_pretrained(str(micro_model_dir), dtype=torch.float32)
    first = TrainBatch(samples=tuple(rl_samples(reference, seed=6)), policy_version=0)
    second = TrainBatch(samples=tuple(rl_samples(reference, seed=7)), policy_version=1)
    backend.train_rl(first)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    backend.save_checkpoint(ckpt)
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "config.json").is_file()
    assert (ckpt / "tokenizer_config.json").is_file()
    assert any((ckpt / "verl").glob("optim_world_size_1_rank_0.pt"))
    saved = _params(AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32))
    for k, v in saved.items():
        torch.testing.assert_close(backend.state_dict()[k], v, rtol=0, atol=0, msg=k)

    again = VerlBackend(config)
    again.load(micro_model_dir, ckpt)
    backend.train_rl(second)
    again.train_rl(second)
    a, b = backend.state_dict(), again.state_dict()
    for k in saved:
        torch.testing.assert_close(b[k], a[k], rtol=1e-6, atol=1e-7, msg=k)
    # without the optimizer state the second AdamW step would differ: this one moved
    assert any(not torch.equal(a[k], v) for k, v in saved.items())
    backend.close()
    again.close()


# ---- config mapping (no heavy stack needed) ----


def test_config_mapping_field_by_field() -> None:
    from openforge_trainer.backends.verl_backend import verl_config

    mapped = verl_config(
        cfg(
            algorithm="reinforce++",
            loss="gspo",
            groups_per_step=4,
            mini_batches=2,
            ppo_epochs=3,
            kl_coef=0.05,
            kl_loss_type="k3",
            is_cap=3.0,
            temperature=0.6,
            micro_batch_tokens=8192,
            max_grad_norm=0.5,
            learning_rate=3e-6,
            weight_decay=0.01,
            seed=7,
        )
    )
    actor = mapped["actor_rollout_ref"]["actor"]
    assert mapped["algorithm"]["adv_estimator"] == "reinforce_plus_plus"
    assert mapped["algorithm"]["rollout_correction"] == {
        "rollout_is": "token",
        "rollout_is_threshold": 3.0,
        "bypass_mode": False,
    }
    assert mapped["data"]["train_batch_size"] == 4
    assert mapped["actor_rollout_ref"]["rollout"] == {"n": 3, "temperature": 0.6}
    assert actor["ppo_mini_batch_size"] == 2  # prompts; veRL multiplies by rollout.n
    assert actor["ppo_epochs"] == 3 and actor["shuffle"] is False and actor["data_loader_seed"] == 7
    assert actor["policy_loss"] == {"loss_mode": "gspo"}
    assert actor["use_kl_loss"] is True and actor["kl_loss_coef"] == 0.05 and actor["kl_loss_type"] == "k3"
    assert actor["use_dynamic_bsz"] is True and actor["ppo_max_token_len_per_gpu"] == 8192
    assert actor["optim"] == {"optimizer": "AdamW", "lr": 3e-6, "weight_decay": 0.01, "clip_grad": 0.5}
    assert (actor["clip_ratio_low"], actor["clip_ratio_high"], actor["clip_ratio_c"]) == (0.2, 0.28, 3.0)
    assert actor["strategy"] == "fsdp2"
    # CPU: fp32 without autocast, padded micro-batches with SDPA, no torch.compile
    assert actor["fsdp_config"]["mixed_precision"]["param_dtype"] == "fp32"
    assert actor["fsdp_config"]["use_torch_compile"] is False
    model = mapped["actor_rollout_ref"]["model"]
    assert model["path"] == "m" and model["use_remove_padding"] is False
    assert model["override_config"] == {"attn_implementation": "sdpa"}
    assert (mapped["trainer"]["n_gpus_per_node"], mapped["trainer"]["nnodes"]) == (1, 1)
    assert mapped["openforge"]["runner"] == "in_process"


def test_cuda_keeps_verl_s_engine_defaults() -> None:
    from openforge_trainer.backends.verl_backend import verl_config

    mapped = verl_config(cfg(device="cuda", verl={"strategy": "fsdp"}))
    actor = mapped["actor_rollout_ref"]["actor"]
    assert actor["fsdp_config"] == {} and actor["strategy"] == "fsdp"
    assert mapped["trainer"]["device"] == "cuda"
    assert "enable_gradient_checkpointing" not in mapped["actor_rollout_ref"]["model"]  # veRL's default


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_precision_sets_fsdp_mixed_precision_over_fp32_master_weights(precision: str) -> None:
    from verl.workers.config import FSDPEngineConfig, HFModelConfig

    from openforge_trainer.backends.verl_backend import verl_config
    from openforge_trainer.backends.verl_worker import engine_settings

    mapped = verl_config(cfg(device="cuda", precision=precision, gradient_checkpointing=True))
    fsdp = mapped["actor_rollout_ref"]["actor"]["fsdp_config"]
    assert fsdp["model_dtype"] == "fp32"
    assert fsdp["mixed_precision"] == {"param_dtype": precision, "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    settings = engine_settings(mapped)
    assert settings["model"]["enable_gradient_checkpointing"] is True
    assert "enable_gradient_checkpointing" in {f.name for f in dataclasses.fields(HFModelConfig)}
    engine = FSDPEngineConfig(**settings["engine"])  # veRL accepts the mapping
    assert engine.mixed_precision is not None and engine.model_dtype == "fp32"
    assert engine.mixed_precision["param_dtype"] == precision


def test_verl_on_cpu_refuses_bf16() -> None:
    from openforge_trainer.backends.verl_backend import verl_config

    with pytest.raises(InvalidArgument, match="precision"):
        verl_config(cfg(precision="bf16"))


@pytest.mark.parametrize(
    ("over", "field", "words"),
    [
        ({"groups_per_step": 3, "mini_batches": 2}, "mini_batches", "multiple of mini_batches"),
        ({"max_grad_norm": 0.0}, "max_grad_norm", "always clips"),
        ({"mode": "sft", "loss_agg_mode": "seq-mean-token-sum"}, "loss_agg_mode", "token mean"),
        ({"device": "mps"}, "device", "cuda"),
        ({"verl": {"distributed": True}}, "device", "CUDA GPUs"),
        ({"verl": {"n_gpus_per_node": 2}}, "verl.n_gpus_per_node", "verl.distributed"),
        (
            {"device": "cuda", "group_size": 3, "verl": {"distributed": True, "n_gpus_per_node": 4}},
            "verl.n_gpus_per_node",
            "not a multiple of 4 GPUs",
        ),
    ],
)
def test_config_veRL_cannot_express_is_rejected(over: dict[str, Any], field: str, words: str) -> None:
    from openforge_trainer.backends.verl_backend import verl_config

    with pytest.raises(InvalidArgument) as err:
        verl_config(cfg(**over))
    assert [v.field for v in err.value.violations] == [field]
    assert "verl backend cannot express" in str(err.value) and words in str(err.value)


def test_actor_config_is_a_valid_verl_actor_config(heavy_stack: None) -> None:
    from openforge_trainer.backends.verl_backend import actor_config

    actor = actor_config(cfg(loss="gspo", kl_coef=0.1, mini_batches=2))
    assert actor.policy_loss.loss_mode == "gspo"
    assert actor.ppo_mini_batch_size == 3 and actor.rollout_n == 3
    assert actor.use_kl_loss and actor.kl_loss_coef == 0.1
