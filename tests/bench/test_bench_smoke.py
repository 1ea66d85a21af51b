"""The benchmark harness at smoke size: every named benchmark is in the report with sane
fields. No timing is asserted — benchmarks measure, `make bench-gate` judges."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import names, recovery
from bench.gate import evaluate
from bench.harness import REPETITIONS, load_results
from bench.runtime_baseline import RUNTIME_VS_BASELINE, baseline_commit, has_commit
from bench.state_growth import CELL_BYTES
from keylane.core.pages import PAGED_FROM_BYTES
from tests.broker import REPO

pytestmark = pytest.mark.kafka


@pytest.mark.timeout(600)
def test_smoke_run_reports_every_benchmark(kafka_bootstrap: str, tmp_path: Path) -> None:
    out, report = tmp_path / "out", tmp_path / "bench-report.md"
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    run = subprocess.run(
        [sys.executable, "-m", "bench.run", "--size", "smoke", "--out", str(out), "--report", str(report)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "[bench" in run.stderr, "long runs show progress"

    size, results = load_results(out / "results.json")
    assert size == "smoke"
    assert set(results) >= set(names.EXPECTED)
    for name in names.EXPECTED:
        result = results[name]
        assert result.samples or result.rate is not None, f"{name} measured nothing"
        assert len(result.repetitions) == REPETITIONS["smoke"], f"{name} records each repetition's figure"
        if result.rate is not None:
            assert math.isfinite(result.rate) and result.rate > 0, name
        if result.samples:
            summary = result.summary()
            assert all(math.isfinite(v) for v in result.samples), name
            assert summary["p50"] <= summary["p99"], name
    for n in names.FANOUT_SHARDS:
        extra = results[names.HOT_KEY_FANOUT[n]].extra
        assert sum(extra["spread"].values()) > 0 and len(extra["spread"]) <= n
        assert set(extra["partitions"]) == set(extra["spread"]) or set(extra["spread"]) <= set(
            extra["partitions"]
        )
    assert results[names.PER_KEY_CEILING].extra["bound_rate"] > 0
    for kib in names.STATE_GROWTH_KIB:
        extra = results[names.STATE_GROWTH[kib]].extra
        assert extra["changelog_records_per_activation"] >= 1, "every activation writes its state"
        # An activation writes at least the 1 KiB it changed, and a paged memory (64 and
        # 512 KiB) no more than 4x that, however much the key holds: bytes, not timing.
        assert extra["changelog_bytes_per_activation"] >= CELL_BYTES, kib
        if kib * 1024 >= PAGED_FROM_BYTES:
            assert extra["changelog_records_per_activation"] >= 2, "its pages, then its record"
            assert extra["write_amplification"] <= 4, kib
    assert results[names.E2E_NOOP].samples, "e2e latency samples"
    # The baseline commit's keylane, measured beside this tree's where the checkout has it.
    same_run = results[RUNTIME_VS_BASELINE].extra
    if has_commit(baseline_commit()):
        (then,), (now,) = same_run["baseline"], same_run["current"]
        assert then["package"] != now["package"] and now["package"].startswith(str(REPO))
        assert same_run["suspension_ratio"] > 0
    else:
        assert same_run["unavailable"], "a shallow clone says why the targets use the stored figures"
    for keys in recovery.KEYS["smoke"]:
        extra = results[recovery.result_name(keys)].extra
        assert extra["keys"] == keys and extra["changelog_records"] >= keys
        assert extra["changelog_bytes"] is None or extra["changelog_bytes"] >= keys * recovery.MEMORY_BYTES
        assert extra["volume_lost_replayed_records"] >= keys, "a fresh volume replays the whole changelog"
        assert extra["volume_kept_replayed_records"] < keys, "a kept volume replays only the tail"
        for figure in (
            "volume_kept_ready_s",
            "volume_kept_first_event_s",
            "volume_lost_ready_s",
            "volume_lost_first_event_s",
            "standby0_failover_s",
            "standby1_failover_s",
        ):
            assert math.isfinite(extra[figure]) and extra[figure] > 0, figure
        assert extra["standby1_failover_replayed_records"] < extra["standby0_failover_replayed_records"], (
            "a standby copy spares the survivor the replay of the dead worker's partitions"
        )

    text = report.read_text()
    for name in names.EXPECTED:
        assert f"| {name} |" in text, f"{name} missing from the report's summary table"
    for keys in recovery.KEYS["smoke"]:
        assert f"\n| {keys:,} | " in text, f"recovery of {keys} keys missing from the report's Recovery table"
    for section in (
        "## Targets",
        "## Gate",
        "## Throughput-math inputs (seed 000)",
        "## Hot-key fan-out",
        "## Key lanes vs partition lanes",
        "## State cost against what changed",
        "## Recovery",
    ):
        assert section in text
    for plot in ("overhead_tiers.png", "fanout_scaling.png", "state_commit.png"):
        assert (out / plot).stat().st_size > 1000 and plot in text
    gate = evaluate(results)
    assert any(not c.passed for c in gate if "samples" in c.name), (
        "a smoke run cannot pass the 1,000-sample gate"
    )
    gate_run = subprocess.run(
        [sys.executable, "-m", "bench.gate", str(out / "results.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert gate_run.returncode == 1 and "FAIL  overhead_50ms has >= 1000 samples" in gate_run.stdout
    assert json.loads((out / "results.json").read_text())["results"][names.OVERHEAD[50]]["unit"] == "ms"
