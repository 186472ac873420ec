"""The trainer's Prometheus sink: the last step's metrics as gauges, per run."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from openforge_trainer.adapters.sinks import PrometheusSink


async def test_each_run_shows_its_last_step_and_keeps_names_a_step_did_not_report() -> None:
    registry = CollectorRegistry()
    sink = PrometheusSink(registry)

    def metric(run: str, name: str) -> float | None:
        value: float | None = registry.get_sample_value("openforge_train_metric", {"run_id": run, "metric": name})
        return value

    await sink.write("a", 1, {"reward/mean": 0.25, "eval/reward/mean": 0.1, "rollouts/excluded/failed": 2.0}, 0.0)
    await sink.write("a", 2, {"reward/mean": 0.5, "rollouts/excluded/failed": 0.0}, 1.0)
    await sink.write("b", 1, {"reward/mean": 0.75}, 1.0)
    await sink.close()
    assert registry.get_sample_value("openforge_train_step", {"run_id": "a"}) == 2
    assert registry.get_sample_value("openforge_train_step", {"run_id": "b"}) == 1
    assert (metric("a", "reward/mean"), metric("b", "reward/mean")) == (0.5, 0.75)
    assert metric("a", "rollouts/excluded/failed") == 0.0
    assert metric("a", "eval/reward/mean") == 0.1  # no evaluation at step 2: the last one stays
    assert metric("b", "eval/reward/mean") is None
