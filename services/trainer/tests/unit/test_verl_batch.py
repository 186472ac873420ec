"""Store samples ⇄ veRL ``DataProto``: exact, token for token and mask for mask.

Checked against veRL's own helpers (``compute_position_id_with_mask``,
``left_right_2_no_padding``, ``no_padding_2_padding``), not against our reading of them.
"""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest

from openforge_trainer.domain.samples import TrainSample

pytestmark = pytest.mark.usefixtures("heavy_stack")


def f32(x: float) -> float:
    """``x`` rounded to float32, as the store's proto (``repeated float rollout_logprobs``) holds it."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def store_samples(seed: int = 0, *, vocab: int = 64) -> list[TrainSample]:
    """Samples shaped like the store's: varied prompt and response lengths, tool spans (mask 0)
    inside and at the end of responses, one empty response, float32 behaviour logprobs, mixed
    policy versions, float64 rewards."""
    rng = random.Random(seed)
    out: list[TrainSample] = []
    for g, n in (("g-a", 3), ("g-b", 2), ("g-c", 1)):
        for i in range(n):
            p = rng.randint(1, 9)
            spans = [(1, rng.randint(1, 4)), (0, rng.randint(0, 3)), (1, rng.randint(0, 4)), (0, rng.randint(0, 2))]
            mask = [m for m, k in spans for _ in range(k)]
            if g == "g-c":
                mask = []
            response = [rng.randrange(1, vocab) for _ in mask]
            out.append(
                TrainSample(
                    sample_id=f"{g}-{i}/0",
                    rollout_id=f"{g}-{i}",
                    group_id=g,
                    task_id=f"task-{g}",
                    prompt_ids=tuple(rng.randrange(1, vocab) for _ in range(p)),
                    response_ids=tuple(response),
                    loss_mask=tuple(mask),
                    behaviour_logprobs=tuple(f32(-rng.random() * 3) if m else 0.0 for m in mask),
                    policy_versions=tuple(rng.randint(3, 5) if m else 0 for m in mask),
                    reward=rng.random() / 3,
                )
            )
    return out


def test_round_trip_is_exact() -> None:
    from openforge_trainer.backends.verl_batch import dataproto_to_samples, samples_to_dataproto

    samples = store_samples()
    data = samples_to_dataproto(samples, pad_token_id=0, temperature=0.7, policy_version=5)
    assert dataproto_to_samples(data) == samples
    # a non-zero pad id changes nothing either (pads are found by the attention mask)
    assert dataproto_to_samples(samples_to_dataproto(samples, pad_token_id=7)) == samples
    assert data.meta_info == {"temperature": 0.7, "policy_version": 5, "pad_token_id": 0}


def test_layout_is_verl_s_left_right_padding() -> None:
    import torch
    from verl.utils.model import compute_position_id_with_mask

    from openforge_trainer.backends.verl_batch import samples_to_dataproto

    samples = store_samples(seed=1)
    data = samples_to_dataproto(samples, pad_token_id=0)
    b = data.batch
    width_p = max(len(s.prompt_ids) for s in samples)
    width_r = max(len(s.response_ids) for s in samples)
    assert b["prompts"].shape == (len(samples), width_p)
    assert b["responses"].shape == (len(samples), width_r)
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], dim=1))
    assert torch.equal(b["position_ids"], compute_position_id_with_mask(b["attention_mask"]))  # type: ignore[no-untyped-call]
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        # prompts left-padded, responses right-padded
        assert b["attention_mask"][i].tolist() == [0] * (width_p - p) + [1] * (p + r) + [0] * (width_r - r)
        assert b["prompts"][i].tolist() == [0] * (width_p - p) + list(s.prompt_ids)
        assert b["responses"][i].tolist() == list(s.response_ids) + [0] * (width_r - r)
        assert b["response_mask"][i].tolist() == list(s.loss_mask) + [0] * (width_r - r)
        assert b["rollout_log_probs"][i].tolist() == list(s.behaviour_logprobs) + [0.0] * (width_r - r)
        assert b["policy_versions"][i].tolist() == list(s.policy_versions) + [0] * (width_r - r)
        # the first real token has position 0 whatever the left padding
        assert b["position_ids"][i, width_p - p :].tolist()[: p + r] == list(range(p + r))
        # outcome reward on the last loss-mask token (veRL's token_level_rewards layout)
        scores = b["token_level_rewards"][i].tolist()
        last = max((j for j, m in enumerate(s.loss_mask) if m), default=None)
        assert scores == [pytest.approx(s.reward, rel=1e-6) if j == last else 0.0 for j in range(width_r)], s.sample_id
    assert list(data.non_tensor_batch["uid"]) == [s.group_id for s in samples]
    assert list(data.non_tensor_batch["reward"]) == [s.reward for s in samples]


def test_verl_s_no_padding_conversion_recovers_every_sequence() -> None:
    """What veRL's actor sees after ``left_right_2_no_padding``: each row's real tokens, in order,
    and ``no_padding_2_padding`` maps entry t-1 of a sequence back onto response token t."""
    import torch
    from verl.workers.utils.padding import no_padding_2_padding

    from openforge_trainer.backends.verl_batch import samples_to_dataproto
    from openforge_trainer.backends.verl_worker import update_tensordict

    samples = store_samples(seed=2)
    data = samples_to_dataproto(samples)
    td = update_tensordict(data, mini_batch_size=len(samples), epochs=2, seed=0, calculate_entropy=False)
    rows = td["input_ids"].unbind()
    for s, row, pos in zip(samples, rows, td["position_ids"].unbind(), strict=True):
        assert row.tolist() == list(s.prompt_ids) + list(s.response_ids)
        assert pos.tolist() == list(range(len(row)))
    # a per-token tensor whose entry t is "the next token" maps onto the responses exactly
    next_tokens = torch.cat([torch.roll(r, -1) for r in rows]).float()
    padded = no_padding_2_padding(next_tokens, td)
    assert torch.equal(padded.long() * data.batch["attention_mask"][:, -padded.shape[1] :], data.batch["responses"])
    # what the worker's loss reads: the response mask, the mini-batch and epoch settings
    assert torch.equal(td["loss_mask"], data.batch["response_mask"])
    assert (td["mini_batch_size"], td["global_batch_size"], td["epochs"]) == (len(samples), len(samples), 2)
    assert td["dataloader_kwargs"] == {"shuffle": False}


def test_sft_layout_masks_the_whole_sequence() -> None:
    """veRL's SFT layout: ``loss_mask`` nested over prompt + response, 0 on the prompt, our loss
    mask on the response (``sft_loss`` shifts it onto the log-probs)."""
    from openforge_trainer.backends.verl_batch import samples_to_dataproto
    from openforge_trainer.backends.verl_worker import sft_tensordict

    samples = store_samples(seed=5)
    td = sft_tensordict(samples_to_dataproto(samples))
    for s, mask, ids in zip(samples, td["loss_mask"].unbind(), td["input_ids"].unbind(), strict=True):
        assert mask.tolist() == [0] * len(s.prompt_ids) + list(s.loss_mask)
        assert ids.tolist() == list(s.prompt_ids) + list(s.response_ids)


def test_advantages_are_grouped_by_uid() -> None:
    import importlib

    from openforge_trainer.backends.verl_batch import compute_advantages, samples_to_dataproto

    core_algos: Any = importlib.import_module("verl.trainer.ppo.core_algos")
    samples = [s for s in store_samples(seed=3) if s.sampled_tokens]
    data = samples_to_dataproto(samples)
    compute_advantages(core_algos, data, estimator="rloo", gamma=1.0, norm_adv_by_std=True)
    adv = data.batch["advantages"]
    for i, s in enumerate(samples):
        others = [o.reward for o in samples if o.group_id == s.group_id and o is not s]
        want = s.reward - sum(others) / len(others) if others else s.reward
        got = adv[i, : len(s.loss_mask)]
        assert [float(x) for x in got] == [pytest.approx(want * m, abs=1e-6) for m in s.loss_mask]
