"""The short soak (the full one: `python benchmarks/bench_prepare.py --soak 10000`): mixed claims prepared and
unprepared through `dradriver run`, killed at random moments and restarted; nothing leaks or grows."""

from __future__ import annotations

from pathlib import Path

from support.soak import run_soak


def test_cycles_with_random_kills_leave_nothing_behind_and_nothing_grows(root: Path) -> None:
    result = run_soak(root, 45, kill_every=10)
    assert result.cycles == 45 and result.kills == 1 and result.mps_cycles > 0
    assert result.leftovers == {
        "mig_instances": 0,
        "cdi_files": 0,
        "temp_files": 0,
        "checkpoint_claims": 0,
        "mps_daemons": 0,
        "mps_dirs": 0,
        "mps_shm_mounts": 0,
        "gpu_settings": 0,
    }
    first, last = result.marks
    assert last.open_files <= first.open_files
    assert last.threads <= first.threads + 2  # gRPC's pool may start a thread or two on demand, bounded
    assert last.rss_kib - first.rss_kib < 4 * 1024
