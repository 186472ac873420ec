"""Resource use over a run's time (``openforge_cli.resource_log``) and the dashboard's curves of it
(``views.resource_curves``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from prometheus_client import REGISTRY, start_http_server

from openforge_cli import local
from openforge_cli.dash.views import resource_curves
from openforge_cli.resource_log import FILE, ResourceLog, read


def _sample(t: float, cores: float, used_gib: float, services: dict[str, tuple[float, float]]) -> dict[str, object]:
    return {
        "t": t,
        "machine": {"cpu_cores": cores, "cores": 2, "memory_bytes": used_gib * 2**30, "memory_total_bytes": 24 * 2**30},
        "services": {n: {"cpu_s": c, "rss_bytes": m * 2**30} for n, (c, m) in services.items()},
    }


def test_curves_give_cores_busy_from_cpu_time_and_memory_in_gib_with_nothing_across_a_restart() -> None:
    samples = [
        _sample(1000.0, 0.5, 4.0, {"trainer": (10.0, 1.0), "proxy": (1.0, 0.25)}),
        _sample(1060.0, 1.5, 5.0, {"trainer": (40.0, 1.5), "proxy": (4.0, 0.25)}),
        _sample(1120.0, 1.0, 5.5, {"trainer": (2.0, 0.5)}),  # trainer restarted; proxy not read
        _sample(1180.0, 1.0, 5.5, {"trainer": (8.0, 0.5), "proxy": (7.0, 0.5)}),
    ]
    curves = resource_curves(samples)
    assert curves["cores"] == 2 and curves["memory_total_gib"] == 24.0
    cpu = {s["label"]: s["points"] for s in curves["cpu"]}
    assert [s["label"] for s in curves["cpu"]] == ["machine", "proxy", "trainer"]
    assert cpu["machine"] == [[0.0, 0.5], [1.0, 1.5], [2.0, 1.0], [3.0, 1.0]]
    assert cpu["trainer"] == [[1.0, 0.5], [3.0, 0.1]]  # 30 s of CPU in 60 s; the restart's drop skipped
    assert cpu["proxy"] == [[1.0, 0.05], [3.0, 0.025]]  # 3 s in the 120 s since it was last read
    memory = {s["label"]: s["points"] for s in curves["memory"]}
    assert memory["machine"] == [[0.0, 4.0], [1.0, 5.0], [2.0, 5.5], [3.0, 5.5]]
    assert memory["proxy"] == [[0.0, 0.25], [1.0, 0.25], [3.0, 0.5]]
    assert resource_curves([]) == {"cpu": [], "memory": [], "cores": None, "memory_total_gib": None}


def test_the_log_samples_the_machine_and_each_services_metrics_until_the_services_are_gone(tmp_path: Path) -> None:
    port = local.free_port("127.0.0.1")
    server, thread = start_http_server(port, addr="127.0.0.1", registry=REGISTRY)  # this process's process_* metrics
    try:
        local.UpState(
            nats_url="nats://127.0.0.1:1",
            processes=[
                local.ProcessInfo("nats", 1, "nats://127.0.0.1:1", "nats.log"),  # no metrics: not sampled
                local.ProcessInfo("proxy", 2, "127.0.0.1:1", "proxy.log", metrics=f"127.0.0.1:{port}"),
                local.ProcessInfo(
                    "trainer", 3, "127.0.0.1:2", "trainer.log", metrics=f"127.0.0.1:{local.free_port('127.0.0.1')}"
                ),
            ],
        ).save(tmp_path)
        log = ResourceLog(tmp_path, interval_s=0.2)
        log.start()
        deadline = time.monotonic() + 20
        while len(read(tmp_path)) < 2:
            assert time.monotonic() < deadline, "no samples"
            time.sleep(0.1)
        (tmp_path / local.STATE_FILE).unlink()  # `down` removes it: the log ends by itself
        deadline = time.monotonic() + 5
        while log.running:
            assert time.monotonic() < deadline, "the log outlived the services"
            time.sleep(0.05)
        log.stop()
    finally:
        server.shutdown()
        thread.join()
    samples = read(tmp_path)
    first = samples[0]
    assert set(first["services"]) == {"proxy"}  # the trainer's endpoint does not answer: left out
    assert first["services"]["proxy"]["rss_bytes"] > 10 * 2**20 and first["services"]["proxy"]["cpu_s"] > 0
    machine = first["machine"]
    assert machine["cores"] >= 1 and 0 <= machine["cpu_cores"] <= machine["cores"]
    assert 0 < machine["memory_bytes"] < machine["memory_total_bytes"]
    assert [s["t"] for s in samples] == sorted(s["t"] for s in samples)
    (tmp_path / FILE).write_text((tmp_path / FILE).read_text() + '{"t": 1, "mach')  # cut short by a stop
    assert len(read(tmp_path)) == len(samples)
    assert json.loads((tmp_path / FILE).read_text().splitlines()[0]) == first
