"""The ``verl`` backend's distributed path (``verl.distributed``: veRL's Ray worker group of FSDP
``TrainingWorker``) on a machine without CUDA.

Covered here: the config mapping to the worker group, the clear failure before any Ray process
starts, and the hand-off up to the GPUs: the worker config, the loss function and our update
TensorDict go through Ray's serializer and veRL's own data-parallel split (what its dispatch does
before the remote call), and each rank's share is the rows, masks and settings it should get.
Covered only by ``tools/gpu/verl_check.py`` (> 1 GPU): the remote workers themselves (NCCL
FSDP over the ranks, the gradient all-reduce, the checkpoint gathered on rank 0).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from openforge_core.errors import FailedPrecondition
from openforge_core.run_config import RunConfig
from openforge_trainer.domain.samples import TrainSample

BASE: dict[str, Any] = {
    "model": "m",
    "tasks": ["t"],
    "group_size": 4,
    "groups_per_step": 4,
    "mini_batches": 2,
    "device": "cuda",
    "verl": {"distributed": True, "n_gpus_per_node": 2, "nnodes": 2},
}


def cfg(**over: Any) -> RunConfig:
    return RunConfig.model_validate({**BASE, **over})


def samples(n: int, seed: int = 0) -> list[TrainSample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(2, 60) for _ in range(rng.randint(1, 6))]
        mask = [1] * rng.randint(1, 4) + [0] * rng.randint(0, 2) + [1] * rng.randint(0, 3)
        out.append(
            TrainSample(
                sample_id=f"s{i}/0",
                rollout_id=f"s{i}",
                group_id=f"g{i // 4}",
                task_id="t",
                prompt_ids=tuple(prompt),
                response_ids=tuple(rng.randrange(2, 60) for _ in mask),
                loss_mask=tuple(mask),
                behaviour_logprobs=tuple(-rng.random() if m else 0.0 for m in mask),
                policy_versions=tuple(0 for _ in mask),
                reward=float(i % 2),
            )
        )
    return out


def test_mapping_sizes_the_worker_group() -> None:
    from openforge_trainer.backends.verl_backend import verl_config
    from openforge_trainer.backends.verl_worker import resource_pool_spec

    mapped = verl_config(cfg())
    assert (mapped["trainer"]["n_gpus_per_node"], mapped["trainer"]["nnodes"]) == (2, 2)
    assert mapped["trainer"]["device"] == "cuda"
    assert mapped["openforge"]["runner"] == "ray_worker_group"
    # no CPU overrides: veRL's GPU engine defaults (fp32 master weights, bf16 autocast)
    assert mapped["actor_rollout_ref"]["actor"]["fsdp_config"] == {}
    assert resource_pool_spec(2, 2)["process_on_nodes"] == [2, 2]


def test_without_cuda_construction_fails_clearly_before_ray_starts(heavy_stack: None, tmp_path: Any) -> None:
    import ray
    import torch

    from openforge_trainer.backends.verl_backend import VerlBackend

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the worker group would start")
    backend = VerlBackend(cfg())
    (tmp_path / "config.json").write_text('{"model_type": "qwen2", "pad_token_id": 0}')
    with pytest.raises(FailedPrecondition) as err:
        backend.load(tmp_path, None)
    assert "no CUDA device" in str(err.value) and "verl.distributed" in str(err.value)
    assert not ray.is_initialized()


def test_hand_off_to_the_ranks(heavy_stack: None, micro_model_dir: Any) -> None:
    """What ``RayWorkerGroup`` would ship: the worker config and loss function survive Ray's
    serializer; veRL's dispatch split of our update TensorDict gives each of the 4 ranks its
    contiguous quarter of the rows with every per-row key, and the mini-batch settings."""
    import importlib

    import torch

    cloudpickle: Any = importlib.import_module("ray.cloudpickle")
    decorator: Any = importlib.import_module("verl.single_controller.base.decorator")

    from openforge_trainer.backends import verl_worker
    from openforge_trainer.backends.verl_backend import actor_config, verl_config
    from openforge_trainer.backends.verl_batch import samples_to_dataproto

    config = cfg()
    mapped = verl_config(config)
    worker_config = verl_worker.training_worker_config(mapped, micro_model_dir)
    shipped = cloudpickle.loads(cloudpickle.dumps(worker_config))
    assert shipped.engine_config.strategy == "fsdp2" and shipped.optimizer_config.clip_grad == config.max_grad_norm
    assert shipped.model_config.path == str(micro_model_dir)
    loss_fn = cloudpickle.loads(cloudpickle.dumps(verl_worker.ppo_loss_fn(actor_config(config))))
    assert loss_fn.keywords["config"].ppo_mini_batch_size == 8
    # the remote class travels by reference: each worker imports our module, which loads veRL
    # without HF datasets, and gets veRL's TrainingWorker itself
    remote_module: Any = importlib.import_module("openforge_trainer.backends.verl_remote")
    engine_workers: Any = importlib.import_module("verl.workers.engine_workers")
    pickled = cloudpickle.dumps(remote_module.TrainingWorker)
    assert len(pickled) < 500 and b"openforge_trainer.backends.verl_remote" in pickled
    assert remote_module.TrainingWorker.__mro__[1] is engine_workers.TrainingWorker

    batch = samples(16)
    data = samples_to_dataproto(batch)
    data.batch["advantages"] = torch.randn(data.batch["responses"].shape)
    td = verl_worker.update_tensordict(data, mini_batch_size=8, epochs=1, seed=0, calculate_entropy=True)
    world = 4
    (chunks,), _ = decorator._split_args_kwargs_data_proto(world, td)
    assert len(chunks) == world
    for rank, chunk in enumerate(chunks):
        chunk = cloudpickle.loads(cloudpickle.dumps(chunk))
        rows = range(rank * 4, rank * 4 + 4)
        ids = chunk["input_ids"].unbind()
        for i, row in zip(rows, ids, strict=True):
            assert row.tolist() == list(batch[i].prompt_ids) + list(batch[i].response_ids)
        torch.testing.assert_close(chunk["advantages"], data.batch["advantages"][list(rows)])
        assert torch.equal(chunk["loss_mask"], data.batch["response_mask"][list(rows)])
        # each rank's mini-batch share: veRL divides the global mini-batch by the dp size
        assert chunk["mini_batch_size"] % world == 0 and chunk["global_batch_size"] == 8
