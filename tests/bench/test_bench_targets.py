"""The judging side of the benchmarks, without a broker: every target of bench/targets.py is in
the gate and the report, key lanes run below what the worker's path carries, and the hot key's
payloads spread evenly over its shards."""

from __future__ import annotations

from collections import Counter

import pytest

from bench import lanes, names
from bench.broker import HOT_KEY, even_payloads
from bench.gate import evaluate
from bench.harness import Result
from bench.report import targets_table
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
        samples(names.OVERHEAD[50], [0.8] * 1000),
        samples(names.TIMER_BASELINE, [0.4] * 1000),
        samples(names.SUSPENSION_ROUNDTRIP, [0.5 * baseline()["suspension_roundtrip_p50_ms"]] * 10),
        rate(names.STATE_GROWTH[1], 1000.0),
        rate(names.STATE_GROWTH[512], 900.0, write_amplification=2.0),
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
    ],
)
def test_a_missed_target_fails_the_gate(name: str, field: str, value: float) -> None:
    results = results_meeting_every_target()
    results[name].extra[field] = value
    (failed,) = failed_targets(results)
    assert "missed by" in failed


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
