"""The CPU-checkable parts of ``tools/gpu/check.py`` (the check itself needs a GPU): the derived
configs are valid train configs, the GPU samples are read and windowed, and the figures and
targets come out of the steps' metrics."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

SCRIPT = Path(__file__).resolve().parents[4] / "tools" / "gpu" / "check.py"


def load_script() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("layout", "warm_start"), [("file", True), ("stream", False)])
def test_each_layouts_config_is_a_valid_train_config_on_the_gpu(layout: str, warm_start: bool, tmp_path: Path) -> None:
    from openforge_cli.train_config import TrainConfig

    check = load_script()
    demo = yaml.safe_load(check.DEMO_CONFIG.read_text())
    cfg = check.layout_config(demo, layout, tmp_path / "model", 3, warm_start=warm_start)
    parsed = TrainConfig.model_validate(yaml.safe_load(yaml.safe_dump(cfg)))
    assert parsed.model.path == tmp_path / "model" and parsed.model.init_tiny is None
    assert parsed.stack.engine == "vllm" and parsed.stack.fallback_engine == ""
    assert parsed.stack.env["OPENFORGE_WEIGHT_SYNC"] == layout
    assert (parsed.run["device"], parsed.run["steps"], parsed.eval) == ("cuda", 3, None)
    assert (parsed.warm_start is not None) is warm_start
    if parsed.warm_start is not None:
        assert parsed.warm_start.run["device"] == "cuda"
    assert Path(parsed.stack.tasks_root).is_dir()
    assert demo["run"].get("device") is None  # the demo itself is untouched


def test_nvidia_smi_lines_and_windows() -> None:
    check = load_script()
    assert check.parse_smi_line("87, 40211", 5.0) == check.GpuSample(5.0, 0.87, 40211.0)
    assert check.parse_smi_line("[N/A], 1", 5.0) is None
    assert check.parse_smi_line("", 5.0) is None
    samples = [check.GpuSample(float(t), u, 1.0) for t, u in [(0, 0.1), (1, 0.9), (2, 0.7), (3, 0.2)]]
    assert check.mean_util(samples, [(0.5, 2.5)]) == pytest.approx(0.8)
    assert check.mean_util(samples, [(0, 0.5), (3, 3.5)]) == pytest.approx(0.15)
    assert check.mean_util(samples, [(1, 1)]) is None  # [start, end)
    assert check.mean_util(samples, [(10, 11)]) is None


def _row(step: int, end: float, sync_s: float, tokens_per_s: float) -> dict[str, Any]:
    metrics = {
        "reward/mean": 0.1 * step,
        "time/step_s": 10.0,
        "time/wait_rollouts_s": 6.0,
        "time/train_s": 2.0,
        "time/checkpoint_s": 1.0,
        "time/weight_sync_s": sync_s,
        "tokens/per_s": tokens_per_s,
        "tokens/sampled": 600.0,
    }
    return {"step": step, "time": end, "metrics": metrics}


def test_figures_and_targets_from_the_steps() -> None:
    check = load_script()
    rows = [_row(1, 110.0, 9.0, 1000.0), _row(2, 120.0, 1.5, 2e5), _row(3, 130.0, 0.5, 3e5)]
    busy = [check.GpuSample(t, 0.9 if (t - 100) % 10 < 6 else 0.3, 100.0) for t in range(100, 131)]
    summary = check.summarize(rows, busy, parameters=300_000_000, peak_tflops=989.0)
    assert summary["reward_per_step"] == pytest.approx([0.1, 0.2, 0.3])
    assert summary["weight_sync_s_median"] == pytest.approx(1.0)  # the first (warm-up) step left out
    assert summary["trainer_mfu_median"] == pytest.approx(6 * 3e8 * 2.5e5 / 989e12)
    assert summary["steps"][0]["sampled_tokens_per_s_waiting"] == pytest.approx(100.0)
    assert summary["gpu_util_rollouts"] > summary["gpu_util_rl"] > 0.3
    met = check.targets_met({"file": summary, "stream": {**summary, "weight_sync_s_median": 3.0}})
    assert summary["trainer_mfu_median"] > 0.4 and summary["gpu_util_rollouts"] == pytest.approx(0.9)
    assert met == {"trainer_mfu": True, "gpu_util_rollouts": True, "weight_sync_s": True}
    slow = {**summary, "weight_sync_s_median": 3.0, "trainer_mfu_median": 0.1, "gpu_util_rollouts": None}
    assert check.targets_met({"file": slow}) == {
        "trainer_mfu": False,
        "gpu_util_rollouts": False,
        "weight_sync_s": False,
    }
