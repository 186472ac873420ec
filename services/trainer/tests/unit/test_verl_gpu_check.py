"""The CPU-checkable parts of ``tools/gpu/verl_check.py`` (the script itself needs a GPU and vLLM):
rewards, and the conversion of vLLM outputs into store-shaped samples."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[4] / "tools" / "gpu" / "verl_check.py"


def load_script() -> Any:
    spec = importlib.util.spec_from_file_location("verl_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reward_reads_the_first_number() -> None:
    script = load_script()
    assert script.reward(" 95", 95) == 1.0
    assert script.reward("The answer is 95.", 95) == 1.0
    assert script.reward("96, no 95", 95) == 0.0
    assert script.reward("ninety-five", 95) == 0.0


def test_vllm_outputs_become_store_samples() -> None:
    script = load_script()

    def completion(tokens: list[int], logps: list[float], text: str) -> Any:
        positions = [{t: SimpleNamespace(logprob=lp)} for t, lp in zip(tokens, logps, strict=True)]
        return SimpleNamespace(token_ids=tokens, logprobs=positions, text=text)

    class FakeLLM:
        def generate(self, prompts: list[dict[str, Any]], params: Any, use_tqdm: bool) -> list[Any]:
            assert [p["prompt_token_ids"] for p in prompts] == [[1, 2], [3]]
            return [
                SimpleNamespace(outputs=[completion([7, 8], [-0.5, -1.25], "5"), completion([9], [-2.0], "4")]),
                SimpleNamespace(outputs=[completion([6], [-0.25], "12"), completion([5, 4], [-1.0, -3.0], "x")]),
            ]

    samples, rewards = script.sample_groups(FakeLLM(), None, [([1, 2], 5), ([3], 12)], step=3)
    assert rewards == [1.0, 0.0, 1.0, 0.0]
    assert [s.group_id for s in samples] == ["s3-g0", "s3-g0", "s3-g1", "s3-g1"]
    first = samples[0]
    assert first.prompt_ids == (1, 2) and first.response_ids == (7, 8)
    assert first.loss_mask == (1, 1) and first.behaviour_logprobs == (-0.5, -1.25)
    assert first.policy_versions == (3, 3) and first.reward == 1.0


def test_find_model_honours_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = load_script()
    monkeypatch.setenv("OPENFORGE_GPU_MODEL", str(tmp_path))
    assert script.find_model() == tmp_path


@pytest.mark.parametrize(("gpus", "distributed"), [(1, False), (4, True)])
def test_the_check_picks_the_path_by_gpu_count(gpus: int, distributed: bool) -> None:
    """One GPU: the in-process worker; more: the Ray worker group over all of them (and veRL can
    split the check's mini-batches over them)."""
    import argparse

    from openforge_trainer.backends.verl_backend import verl_config

    script = load_script()
    args = argparse.Namespace(group_size=4, groups=8, lr=2e-6, steps=4, seed=0)
    config = script.run_config(Path("/m"), args, gpus=gpus)
    assert config.verl.distributed is distributed and config.device == "cuda"
    mapped = verl_config(config)
    assert mapped["openforge"]["runner"] == ("ray_worker_group" if distributed else "in_process")
    assert mapped["trainer"]["n_gpus_per_node"] == gpus
    assert ("Ray worker group" in script.describe(config)) is distributed
