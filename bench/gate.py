"""`make bench-gate`: judge one run's results.json against the seed's budget and every target.

It fails (exit 1) when:

* any expected benchmark is missing from the run;
* overhead_50ms has fewer than 1,000 samples, or its p50 >= 15 ms, or its p99 >= 60 ms
  (seed 000's budget for runtime overhead per activation);
* hot_key_fanout N=4 is below 3.2x N=1 (seed 000's fan-out check);
* any target of bench/targets.py is missed or was not measured: ratios measured in the same
  run (keylane against its peers, key lanes against their ideal, fan-out against N, one state
  size against another), e2e latency, and keylane's own cost per activation against the
  baseline commit's keylane, measured in the same run (bench/runtime_baseline.py; the figures
  stored in bench/baseline.json only where the checkout lacks that commit).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from bench import names
from bench.harness import Result, load_results
from bench.targets import TARGETS

OVERHEAD_P50_BUDGET_MS = 15.0
OVERHEAD_P99_BUDGET_MS = 60.0
OVERHEAD_MIN_SAMPLES = 1000
FANOUT_N4_MIN_RATIO = 3.2


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


def evaluate(results: dict[str, Result]) -> list[Check]:
    """Every gate check, passed or not, with what was measured."""
    checks: list[Check] = []
    missing = [name for name in names.EXPECTED if name not in results]
    checks.append(
        Check("every expected result present", not missing, f"missing: {missing}" if missing else "all")
    )
    overhead = results.get(names.OVERHEAD[50])
    if overhead is not None and overhead.samples:
        summary = overhead.summary()
        checks.append(
            Check(
                f"overhead_50ms has >= {OVERHEAD_MIN_SAMPLES} samples",
                summary["n"] >= OVERHEAD_MIN_SAMPLES,
                f"{summary['n']} samples",
            )
        )
        checks.append(
            Check(
                f"overhead_50ms p50 < {OVERHEAD_P50_BUDGET_MS} ms",
                summary["p50"] < OVERHEAD_P50_BUDGET_MS,
                f"p50 {summary['p50']:.3f} ms",
            )
        )
        checks.append(
            Check(
                f"overhead_50ms p99 < {OVERHEAD_P99_BUDGET_MS} ms",
                summary["p99"] < OVERHEAD_P99_BUDGET_MS,
                f"p99 {summary['p99']:.3f} ms",
            )
        )
    n1, n4 = results.get(names.HOT_KEY_FANOUT[1]), results.get(names.HOT_KEY_FANOUT[4])
    if n1 is not None and n4 is not None and n1.rate and n4.rate is not None:
        ratio = n4.rate / n1.rate
        checks.append(
            Check(
                f"hot_key_fanout N=4 >= {FANOUT_N4_MIN_RATIO}x N=1",
                ratio >= FANOUT_N4_MIN_RATIO,
                f"{ratio:.2f}x",
            )
        )
    for target in TARGETS:
        measured, status = target.verdict(results)
        shown = "not measured" if measured is None else f"{measured:,.3f} ({status})"
        passed = measured is not None and target.met(measured)
        checks.append(Check(f"{target.label} {target.goal}", passed, shown))
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Judge a benchmark run (bench/out/results.json).")
    parser.add_argument("results", nargs="?", type=Path, default=Path("bench/out/results.json"))
    args = parser.parse_args(argv)
    if not args.results.exists():
        print(f"bench-gate: {args.results} not found; run 'make bench' first", file=sys.stderr)
        return 1
    size, results = load_results(args.results)
    checks = evaluate(results)
    for check in checks:
        print(f"{'PASS' if check.passed else 'FAIL'}  {check.name}: {check.detail}")
    failed = [c for c in checks if not c.passed]
    print(f"bench-gate ({size} run): {len(checks) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
