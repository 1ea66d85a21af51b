"""The judging side of the benchmarks, without a broker: every target of bench/targets.py is in
the gate and the report, key lanes run below what the worker's path carries, and the hot key's
payloads spread evenly over its shards."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from bench import lanes, names
from bench.broker import HOT_KEY, even_payloads
from bench.gate import evaluate
from bench.harness import Result
from bench.report import baseline_table, targets_table
from bench.runtime_baseline import (
    BASELINE,
    CHUNK,
    CURRENT,
    FREEZE,
    OWN_COST,
    REPO,
    ROUNDS,
    RUNTIME_VS_BASELINE,
    SESSIONS,
    Side,
    baseline_commit,
    baseline_package,
    compare,
    has_commit,
    interleaved,
    measure_both,
)
from bench.targets import TARGETS, baseline
from keylane.keys import shard_key
from keylane.wire import AgentEnvelope, encode


def results_meeting_every_target() -> dict[str, Result]:
    def rate(name: str, value: float, **extra: object) -> Result:
        return Result(name=name, unit="/s", rate=value, extra=dict(extra))

    def samples(name: str, values: list[float]) -> Result:
        return Result(name=name, unit="ms", samples=values)

    results = [
        rate(names.E2E_NOOP, 1000.0, ratio_to_faust=1.1),
        samples(names.E2E_NOOP, [3.0] * 99 + [15.0]),
        rate(names.LANES["key"], 540.0, min_ratio_to_ideal=0.92),
        rate(names.HOT_KEY_FANOUT[1], 18.0),
        rate(names.HOT_KEY_FANOUT[8], 140.0),
        samples(names.OVERHEAD[50], [0.4 + 0.45 * baseline()["overhead_50ms_over_timer_p50_ms"]] * 1000),
        samples(names.TIMER_BASELINE, [0.4] * 1000),
        samples(names.SUSPENSION_ROUNDTRIP, [0.5 * baseline()["suspension_roundtrip_p50_ms"]] * 10),
        rate(names.STATE_GROWTH[1], 1000.0),
        rate(names.STATE_GROWTH[512], 900.0, write_amplification=2.0),
        Result(RUNTIME_VS_BASELINE, "ratio", extra={"own_cost_ratio": 0.45, "suspension_ratio": 0.5}),
    ]
    merged: dict[str, Result] = {}
    for result in results:  # e2e_noop's rate and its latency samples are one Result
        if result.name in merged:
            merged[result.name].samples = result.samples
        else:
            merged[result.name] = result
    return merged


TARGET_CHECKS = {f"{target.label} {target.goal}" for target in TARGETS}


def failed_targets(results: dict[str, Result]) -> list[str]:
    """What the gate says of the targets it missed (its other checks left out)."""
    return [f"{c.name}: {c.detail}" for c in evaluate(results) if c.name in TARGET_CHECKS and not c.passed]


def test_every_target_is_judged_by_the_gate_and_listed_in_the_report() -> None:
    results = results_meeting_every_target()
    checks = {check.name: check for check in evaluate(results)}
    table = "\n".join(targets_table(results))
    for target in TARGETS:
        check = checks[f"{target.label} {target.goal}"]
        assert check.passed, check
        assert f"| {target.label} | {target.goal} |" in table
    assert table.count("| met |") == len(TARGETS)


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [
        (names.E2E_NOOP, "ratio_to_faust", 0.5),
        (names.LANES["key"], "min_ratio_to_ideal", 0.7),
        (names.STATE_GROWTH[512], "write_amplification", 535.0),
        (RUNTIME_VS_BASELINE, "own_cost_ratio", 0.8),
        (RUNTIME_VS_BASELINE, "suspension_ratio", 0.75),
    ],
)
def test_a_missed_target_fails_the_gate(name: str, field: str, value: float) -> None:
    results = results_meeting_every_target()
    results[name].extra[field] = value
    (failed,) = failed_targets(results)
    assert "missed by" in failed


def test_a_figure_at_its_bound_meets_it_whatever_the_rounding() -> None:
    """bench run 1 of 2026-12-07: the 512 KiB rate over 585 ms, the 1 KiB rate over 468 ms."""
    results = results_meeting_every_target()
    results[names.STATE_GROWTH[1]].rate = 1_999 / 0.468
    results[names.STATE_GROWTH[512]].rate = 1_999 / 0.585
    assert results[names.STATE_GROWTH[512]].rate / results[names.STATE_GROWTH[1]].rate < 0.8
    assert failed_targets(results) == []
    results[names.STATE_GROWTH[512]].rate = 1_999 / 0.586
    (failed,) = failed_targets(results)
    assert "missed by 0.00137 (0.998x the goal)" in failed, failed


def test_without_the_baseline_commit_the_own_cost_targets_use_the_stored_figures() -> None:
    results = results_meeting_every_target()
    unavailable = {"unavailable": "shallow clone"}
    results[RUNTIME_VS_BASELINE] = Result(RUNTIME_VS_BASELINE, "ratio", extra=unavailable)
    assert failed_targets(results) == []  # under half the stored own cost, half the stored suspension p50
    results[names.OVERHEAD[50]].samples = [0.4 + 0.8 * baseline()["overhead_50ms_over_timer_p50_ms"]] * 1000
    (failed,) = failed_targets(results)
    assert failed.startswith("keylane's own cost") and "missed by 0.3 (1.600x the goal)" in failed
    assert "not measured: shallow clone" in "\n".join(baseline_table(results))


def test_the_same_run_ratios_are_the_medians_of_each_rounds_ratio() -> None:
    def figures(own_cost: float, suspension: float) -> dict[str, float]:
        return {"own_cost_ms": own_cost, "suspension_roundtrip_p50_ms": suspension}

    then = [figures(1.0, 0.2), figures(2.0, 0.2), figures(1.0, 0.4)]
    now = [figures(0.5, 0.1), figures(0.6, 0.3), figures(0.4, 0.1)]
    result = compare(then, now, "abc")
    assert result.extra["own_cost_ratio"] == pytest.approx(0.4)  # 0.5, 0.3, 0.4
    assert result.extra["suspension_ratio"] == pytest.approx(0.5)  # 0.5, 1.5, 0.25
    assert result.repetitions == pytest.approx([0.5, 1.5, 0.25])
    table = "\n".join(baseline_table({RUNTIME_VS_BASELINE: result}))
    assert "| 2 | 2.000 | 0.600 | 0.2000 | 0.3000 |" in table


def test_a_side_serves_chunks_of_samples_from_its_own_package(tmp_path: Path) -> None:
    with (tmp_path / "stderr").open("w+b") as stderr:
        side = Side(None, stderr)
        try:
            assert side.package == str(REPO / "service" / "keylane")
            round_trips = side.samples("suspension", 7)
            assert len(round_trips) == 7 and all(0 < ms < 1000 for ms in round_trips)
            assert side.samples(FREEZE, 0) == []
            assert len(side.samples("timer_baseline", 10)) == 10  # ten keys, one sleep each
            paired = side.samples(OWN_COST, 30)  # a slice of SLICE (20) of each, then one of ten
            assert {figure: len(samples) for figure, samples in paired.items()} == {
                "overhead_50": 30,
                "timer_baseline": 30,
            }
            assert all(ms >= 0 for ms in paired["overhead_50"])  # each took its 50 ms model call
            with pytest.raises(RuntimeError, match="KeyError: 'no_such_figure'"):
                side.samples("no_such_figure", 1)  # the side's own traceback, not a hang
        finally:
            side.close()


FAKE_FIGURES = {
    BASELINE: {"overhead_50": 1.0, "timer_baseline": 0.5, "suspension": 0.2},
    CURRENT: {"overhead_50": 0.7, "timer_baseline": 0.3, "suspension": 0.1},
}


class FakeSide:
    """A Side without a subprocess: the baseline's package (a path) or this tree's (None),
    answering each figure with its FAKE_FIGURES value and logging what it was asked."""

    def __init__(self, package: Path | None, stderr: object, log: list[tuple[str, str]]) -> None:
        self.name = BASELINE if package is not None else CURRENT
        self.package, self.log = f"/{self.name}/keylane", log
        log.append(("started", self.name))

    def samples(self, figure: str, count: int) -> list[float]:
        self.log.append((self.name, figure))
        return [FAKE_FIGURES[self.name].get(figure, 0.0)] * max(count, 1)

    def p50(self, figure: str, count: int) -> float:
        return self.samples(figure, count)[0]

    def own_cost(self, count: int) -> tuple[float, float]:
        self.log.append((self.name, OWN_COST))
        return FAKE_FIGURES[self.name]["overhead_50"], FAKE_FIGURES[self.name]["timer_baseline"]

    def close(self) -> None:
        self.log.append(("closed", self.name))


def test_interleaved_rounds_take_turns_and_keep_each_sides_figures() -> None:
    asked: list[tuple[str, str]] = []
    then, now = FakeSide(Path("/baseline"), None, asked), FakeSide(None, None, asked)
    del asked[:]
    rounds = interleaved({BASELINE: then, CURRENT: now}, "smoke", 1)  # type: ignore[dict-item]
    (before,), (after,) = rounds[BASELINE], rounds[CURRENT]
    # Each side's own cost is its overhead less its own wake-up, measured in turns.
    assert before["own_cost_ms"] == pytest.approx(0.5) and after["own_cost_ms"] == pytest.approx(0.4)
    assert (before["timer_baseline_p50_ms"], after["timer_baseline_p50_ms"]) == (0.5, 0.3)
    assert (before["suspension_roundtrip_p50_ms"], after["package"]) == (0.2, "/current/keylane")
    warm_up = [(side, figure) for side in (BASELINE, CURRENT) for figure in [*CHUNK["smoke"], FREEZE]]
    assert asked[: len(warm_up)] == warm_up
    assert asked[len(warm_up) :] == [
        (BASELINE, OWN_COST),
        (CURRENT, OWN_COST),
        (BASELINE, "suspension"),
        (CURRENT, "suspension"),
    ]


def test_the_rounds_are_split_over_pairs_of_subprocesses_started_in_alternating_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[tuple[str, str]] = []
    monkeypatch.setattr("bench.runtime_baseline.Side", lambda package, stderr: FakeSide(package, stderr, log))
    figures = measure_both(Path("/baseline"), "quick")
    assert SESSIONS["quick"] == 2
    started = [entry for entry in log if entry[0] in ("started", "closed")]
    first = [("started", BASELINE), ("started", CURRENT), ("closed", BASELINE), ("closed", CURRENT)]
    second = [("started", CURRENT), ("started", BASELINE), ("closed", CURRENT), ("closed", BASELINE)]
    assert started == [*first, *second]
    assert len(figures[BASELINE]) == len(figures[CURRENT]) == ROUNDS["quick"]
    assert {round["package"] for round in figures[CURRENT]} == {"/current/keylane"}


def test_the_baseline_commits_package_is_unpacked_from_git(tmp_path: Path) -> None:
    package = baseline_package(baseline_commit(), tmp_path)
    if not has_commit(baseline_commit()):  # a shallow clone: the run says so and falls back
        assert package is None
        return
    assert package is not None and (package / "keylane" / "core" / "activation.py").is_file()
    # This tree's deadlines module did not exist then: the package is the commit's, not a copy.
    assert not (package / "keylane" / "core" / "deadlines.py").exists()
    assert baseline_package("0" * 40, tmp_path / "missing") is None


def test_a_target_the_run_did_not_measure_fails_the_gate() -> None:
    results = results_meeting_every_target()
    del results[names.HOT_KEY_FANOUT[8]]
    (failed,) = failed_targets(results)
    assert failed.startswith("hot_key_fanout N=8") and failed.endswith("not measured")


def test_key_lanes_run_below_what_the_worker_path_carried() -> None:
    assert lanes.in_flight(None) == 64, "unmeasured: AgentConfig's default"
    assert lanes.in_flight(100_000.0) == 64
    assert lanes.in_flight(780.0) == 29  # 29 x 20/s = 580/s <= 0.75 x 780/s
    assert lanes.in_flight(10.0) == 1
    for carried in (50.0, 350.0, 780.0, 1700.0):
        ideal = lanes.in_flight(carried) * 1000 / 50
        assert ideal <= max(20.0, lanes.IDEAL_SHARE_OF_E2E * carried)


@pytest.mark.parametrize("shards", [1, 2, 4, 8])
def test_the_hot_keys_payloads_spread_evenly_over_its_shards(shards: int) -> None:
    payloads = even_payloads(HOT_KEY, shards, 96)
    assert len(set(payloads)) == 96
    spread = Counter(shard_key(HOT_KEY, shards, payload=encode(AgentEnvelope(payload=p))) for p in payloads)
    assert len(spread) == shards and set(spread.values()) == {96 // shards}
