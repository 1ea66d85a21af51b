"""Repeated benchmark figures: each repetition's figure is kept, the rate is their median, and a
figure whose repetitions disagree by more than SPREAD_LIMIT is flagged in the report."""

from __future__ import annotations

import asyncio
import gc
import selectors
import threading
from pathlib import Path

import pytest

from bench import names
from bench.harness import REPETITIONS, SPREAD_LIMIT, Recorder, Result, load_results, spread
from bench.report import unstable_figures, write_report
from bench.runtime import bench_noop, bench_state_commit, microsecond_timers, repeated
from bench.targets import e2e_to_peer


def test_spread_is_the_range_over_the_median() -> None:
    assert spread([100.0, 110.0, 90.0]) == pytest.approx(0.2)
    assert spread([5.0]) is None, "one run has no spread"
    assert spread([]) is None


def test_a_figure_past_the_limit_is_unstable_and_named_in_the_report() -> None:
    unit = "activations/s"
    steady = Result(name=names.NOOP_1KEY, unit=unit, rate=100.0, repetitions=[98.0, 100.0, 103.0])
    shaky = Result(name=names.NOOP_1000KEYS, unit=unit, rate=100.0, repetitions=[80.0, 100.0, 120.0])
    assert not steady.unstable and steady.spread is not None and steady.spread <= SPREAD_LIMIT
    assert shaky.unstable
    assert steady.summary()["spread"] == pytest.approx(0.05)
    line = " ".join(unstable_figures({steady.name: steady, shaky.name: shaky}))
    assert names.NOOP_1000KEYS in line and "40%" in line and names.NOOP_1KEY not in line
    assert "within" in " ".join(unstable_figures({steady.name: steady}))


def test_the_e2e_ratio_is_the_median_of_side_by_side_ratios() -> None:
    # Two repetitions on a machine that slowed down between them: each ratio is ~1, the ratio of
    # the two medians is not.
    e2e = Result(
        name=names.E2E_NOOP,
        unit="ms",
        rate=150.0,
        repetitions=[100.0, 200.0, 150.0],
        extra={"ratio_to_faust": 1.0, "ratio_to_faust_by_repetition": [1.0, 1.0, 1.0]},
    )
    peer = Result(name=names.PEER_FAUST, unit="records/s", rate=300.0, repetitions=[100.0, 300.0, 400.0])
    results = {e2e.name: e2e, peer.name: peer}
    assert e2e_to_peer(results, "faust") == 1.0
    del e2e.extra["ratio_to_faust"]
    assert e2e_to_peer(results, "faust") == 0.5, "without repetitions: the ratio of the two rates"


def test_repeated_warms_up_then_runs_each_repetition_with_the_collector_frozen() -> None:
    calls: list[tuple[int, int]] = []

    async def measure(n: int) -> int:
        calls.append((n, gc.get_freeze_count()))
        return n

    results = asyncio.run(repeated(3, 300, measure))
    assert results == [100, 100, 100]
    assert calls[0][0] == 30, "a warm-up on a tenth of the work comes first"
    assert all(frozen > 0 for _, frozen in calls[1:]), "survivors are frozen while a repetition runs"
    assert gc.get_freeze_count() == 0, "and thawed after it"


def test_runtime_figures_carry_their_repetitions_into_the_report(tmp_path: Path) -> None:
    recorder = Recorder(tmp_path / "out", size="quick")
    reps = REPETITIONS["quick"]

    async def measure() -> None:
        await bench_noop(recorder, 300, reps)
        await bench_state_commit(recorder, 1, 30, reps)

    asyncio.run(measure())
    _, results = load_results(tmp_path / "out" / "results.json")
    noop = results[names.NOOP_1KEY]
    assert len(noop.repetitions) == reps and noop.rate == sorted(noop.repetitions)[1]
    commit = results[names.STATE_COMMIT[1]]
    assert len(commit.repetitions) == reps and len(commit.samples) == 30
    report = tmp_path / "bench-report.md"
    write_report(results, size="quick", elapsed_s=1.0, out_dir=tmp_path / "out", path=report)
    row = next(line for line in report.read_text().splitlines() if line.startswith(f"| {names.NOOP_1KEY} |"))
    assert f"({reps} runs)" in row


def test_the_timer_tiers_run_on_their_own_loop_whose_selector_takes_microseconds() -> None:
    """epoll's whole-millisecond timeouts make the tiers' figure a sawtooth of the burst's
    length (bench/runtime.py); select(2) takes its timeout in microseconds."""

    async def probe() -> tuple[type, int]:
        selector = asyncio.get_running_loop()._selector  # type: ignore[attr-defined]
        return type(selector), threading.get_ident()

    selector, thread = asyncio.run(microsecond_timers(probe))
    assert selector is selectors.SelectSelector
    assert thread != threading.get_ident()

    async def fails() -> None:
        raise ValueError("from the tier")

    with pytest.raises(ValueError, match="from the tier"):
        asyncio.run(microsecond_timers(fails))
