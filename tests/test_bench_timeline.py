"""The SSD promotion timeline tool runs, reports every phase of a batch, and leaves the tier's
thread plumbing as it found it (figures are not asserted: timing is the bench's job)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aiotier.tiers._ssd import hops
from aiotier_bench import promote_timeline


async def test_the_timeline_reports_each_phase_and_unwraps_the_plumbing(tmp_path: Path) -> None:
    wrapped = (hops.run_ops, hops.HopRunner._start_hop, hops.HopRunner._hop_done)
    figures = await promote_timeline.measure(rounds=1, root=str(tmp_path), blocks=128)
    assert (hops.run_ops, hops.HopRunner._start_hop, hops.HopRunner._hop_done) == wrapped
    phases = (
        "lookup", "to_first_submit", "to_first_thread", "last_op_starts_after", "threads_reading",
        "ops_end_apart", "to_loop", "landing", "to_caller", "end_step", "batch", "serial",
        "same_work_all_cpus_batch", "cpu_engine", "cpu_loop_thread", "cpu_same_work_all_cpus",
    )  # fmt: skip
    assert tuple(figures) == phases
    assert all(v >= 0 for v in figures.values())
    assert figures["batch"] >= figures["threads_reading"] + figures["lookup"]
    assert figures["cpu_engine"] >= figures["cpu_loop_thread"] > 0
    assert os.listdir(tmp_path) == []  # its tier's directory removed


async def test_the_timeline_refuses_a_partial_batch() -> None:
    with pytest.raises(ValueError, match="multiple of 64"):
        await promote_timeline.measure(rounds=1, blocks=100)
