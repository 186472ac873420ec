"""The reference engine's logprob definition against first principles and against vLLM's own
top-k/top-p implementation."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch", reason="needs torch (requirements/inference-cpu.txt)")

import torch

from openforge_inference.engines.transformers_engine import process_logits


def _logits() -> torch.Tensor:
    return torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 3


def test_greedy_is_plain_log_softmax() -> None:
    x = _logits()
    assert torch.allclose(process_logits(x, 0.0, 5, 0.5), torch.log_softmax(x, -1))


def test_temperature_scales_before_softmax() -> None:
    x = _logits()
    assert torch.allclose(process_logits(x, 0.5, None, None), torch.log_softmax(x / 0.5, -1))


def test_top_k_keeps_k_tokens_and_renormalizes() -> None:
    x = _logits()
    lp = process_logits(x, 1.0, 7, None)
    assert ((lp > -math.inf).sum(-1) == 7).all()
    assert torch.allclose(lp.exp().sum(-1), torch.ones(3))
    kept = x.topk(7, -1).indices
    assert torch.equal(lp.gather(-1, kept) > -math.inf, torch.ones_like(kept, dtype=torch.bool))


def test_top_p_keeps_smallest_nucleus() -> None:
    x = _logits()
    p = 0.8
    lp = process_logits(x, 1.0, None, p)
    probs = torch.softmax(x, -1)
    for row in range(x.shape[0]):
        kept = lp[row] > -math.inf
        assert probs[row][kept].sum() >= p - 1e-6
        # dropping the least likely kept token would fall below p
        least = probs[row][kept].min()
        assert probs[row][kept].sum() - least < p + 1e-6


def test_matches_vllm_apply_top_k_top_p() -> None:
    pytest.importorskip("vllm", reason="vLLM not installed (requirements/inference-cpu.txt)")
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    x = _logits()
    for k, p in ((None, 0.9), (5, None), (10, 0.7)):
        ours = process_logits(x, 0.8, k, p)
        kt = torch.full((3,), k, dtype=torch.long) if k else None
        pt = torch.full((3,), p, dtype=torch.float32) if p else None
        theirs = torch.log_softmax(apply_top_k_top_p((x / 0.8).clone(), kt, pt), -1)
        assert torch.equal(ours == -math.inf, theirs == -math.inf)
        finite = ours > -math.inf
        assert torch.allclose(ours[finite], theirs[finite], atol=1e-6)
