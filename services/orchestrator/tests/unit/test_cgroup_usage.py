"""A sandbox's CPU time and peak memory, read from the cgroup files of each version."""

from __future__ import annotations

from pathlib import Path

from openforge_orchestrator.backends.cgroups import Usage, V1Limiter, V2Limiter


def test_v2_reads_cpu_stat_and_memory_peak(tmp_path: Path) -> None:
    (tmp_path / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    (tmp_path / "memory.peak").write_text("104857600\n")
    assert V2Limiter.usage(tmp_path) == Usage(2.5, 104857600)
    (tmp_path / "memory.peak").unlink()  # before Linux 5.19: no peak
    assert V2Limiter.usage(tmp_path) == Usage(2.5, None)


def test_v1_reads_cpuacct_and_max_usage_from_their_hierarchies(tmp_path: Path) -> None:
    dirs = {c: tmp_path / c for c in ("memory", "pids", "cpu", "cpuacct")}
    for d in dirs.values():
        d.mkdir()
    (dirs["cpuacct"] / "cpuacct.usage").write_text("750000000\n")
    (dirs["memory"] / "memory.max_usage_in_bytes").write_text("52428800\n")
    assert V1Limiter.usage(dirs) == Usage(0.75, 52428800)
    del dirs["cpuacct"]  # cpu and cpuacct mounted together: the cpu folder has the counter
    (dirs["cpu"] / "cpuacct.usage").write_text("1000000000\n")
    assert V1Limiter.usage(dirs) == Usage(1.0, 52428800)
    (dirs["memory"] / "memory.max_usage_in_bytes").write_text("garbage")
    assert V1Limiter.usage(dirs) == Usage(1.0, None)
