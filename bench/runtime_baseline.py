"""keylane's own cost against the baseline commit's, measured in the same run.

Two targets of bench/targets.py halve what an activation cost before issue 24's work:
keylane's own cost (overhead_50ms p50 - timer_baseline_50ms p50) and the suspension round
trip. bench/baseline.json stores those figures as measured on the development machine; on a
machine (or an hour) twice as slow, comparing with them says more about the machine than
about keylane. So the run measures the baseline too, here and now: the keylane package of the
commit bench/baseline.json names (``git archive``; no checkout or install), under this tree's
harness (bench/runtime.py), so both are timed by the same code.

Each repetition (PAIRS[size] of them) runs one subprocess with the baseline's package first on
``sys.path``, then one with this tree's, back to back; a repetition's ratio is of two figures
measured seconds apart, and the result keeps the median of the repetitions' ratios. Without the commit
(a shallow clone) the result says why, and the targets fall back to bench/baseline.json.

    python -m bench.runtime_baseline --measure OUT.json --size quick   # one subprocess's part
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from bench import names
from bench.harness import Recorder, Result, Size, percentile, progress

REPO = Path(__file__).resolve().parent.parent
BASELINE_PATH = Path(__file__).with_name("baseline.json")
RUNTIME_VS_BASELINE = "runtime_vs_baseline"
MEASURE_TIMEOUT_S = 600
# Pairs of subprocesses: one pair's figures swing by a third on a shared machine.
PAIRS: dict[Size, int] = {"smoke": 1, "quick": 5, "full": 7}


@functools.cache
def baseline() -> dict[str, Any]:
    """The stored figures of ``bench/baseline.json``."""
    loaded: dict[str, Any] = json.loads(BASELINE_PATH.read_text())
    return loaded


def baseline_commit() -> str:
    """The commit bench/baseline.json was measured at."""
    commit: str = baseline()["commit"]
    return commit


def has_commit(commit: str) -> bool:
    """Whether this checkout holds ``commit`` (a shallow clone or an export may not)."""
    probe = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    return probe.returncode == 0


def baseline_package(commit: str, dest: Path) -> Path | None:
    """``service/`` of ``commit`` unpacked under ``dest`` (the directory to put first on
    ``sys.path``), or None when this checkout does not have the commit."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit, "service"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    if archive.returncode != 0:
        why = archive.stderr.decode(errors="replace")[-200:].strip()
        progress(f"baseline commit {commit[:12]} not in this checkout: {why}")
        return None
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest / "service"


def measure(package: Path | None, size: Size, out: Path) -> dict[str, Any]:
    """One subprocess's figures (``_measure``) with ``package`` (None: this tree's) first on
    ``sys.path``."""
    path = [str(package)] if package is not None else [str(REPO / "service")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(REPO)])}
    run = subprocess.run(
        [sys.executable, "-m", "bench.runtime_baseline", "--measure", str(out), "--size", size],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=MEASURE_TIMEOUT_S,
        check=False,
    )
    if run.returncode != 0:
        raise RuntimeError(f"runtime baseline measurement failed: {run.stderr[-2000:]}")
    figures: dict[str, Any] = json.loads(out.read_text())
    return figures


async def _measure(size: Size) -> dict[str, Any]:
    """overhead_50ms, timer_baseline_50ms and suspension_roundtrip once each, at ``size``'s
    counts: the p50s and the own cost, and which keylane package ran."""
    import keylane
    from bench import runtime

    counts = runtime.COUNTS[size]
    with tempfile.TemporaryDirectory() as scratch:
        recorder = Recorder(Path(scratch), size=size)
        await runtime.bench_overhead(recorder, 50, counts["overhead_50"], 1)
        await runtime.bench_timer_baseline(recorder, counts["overhead_50"], 1)
        await runtime.bench_suspension_roundtrip(recorder, counts["suspend"], 1)
        p50 = {name: percentile(sorted(result.samples), 50) for name, result in recorder.results.items()}
    return {
        "package": str(Path(keylane.__file__).parent),
        "overhead_50ms_p50_ms": p50[names.OVERHEAD[50]],
        "timer_baseline_p50_ms": p50[names.TIMER_BASELINE],
        "own_cost_ms": p50[names.OVERHEAD[50]] - p50[names.TIMER_BASELINE],
        "suspension_roundtrip_p50_ms": p50[names.SUSPENSION_ROUNDTRIP],
    }


def compare(baseline_runs: list[dict[str, Any]], current_runs: list[dict[str, Any]], commit: str) -> Result:
    """The result: each repetition's figures side by side, and the medians of their ratios."""
    extra: dict[str, Any] = {"baseline_commit": commit, "baseline": baseline_runs, "current": current_runs}
    figures = (("own_cost_ms", "own_cost_ratio"), ("suspension_roundtrip_p50_ms", "suspension_ratio"))
    for figure, ratio_name in figures:
        pairs = zip(baseline_runs, current_runs, strict=True)
        ratios = [now[figure] / then[figure] for then, now in pairs if then[figure] > 0]
        extra[f"{ratio_name}_by_repetition"] = ratios
        extra[ratio_name] = statistics.median(ratios) if ratios else None
    return Result(
        name=RUNTIME_VS_BASELINE,
        unit="ratio",
        repetitions=list(extra["suspension_ratio_by_repetition"]),
        extra=extra,
    )


async def run_baseline_comparison(recorder: Recorder, *, size: Size) -> None:
    """Alternate the baseline's package and this tree's, PAIRS[size] times each."""
    commit = baseline_commit()
    with tempfile.TemporaryDirectory(prefix="keylane-baseline-") as scratch:
        package = await asyncio.to_thread(baseline_package, commit, Path(scratch))
        if package is None:
            recorder.add(
                Result(
                    name=RUNTIME_VS_BASELINE,
                    unit="ratio",
                    extra={"baseline_commit": commit, "unavailable": "the commit is not in this checkout"},
                )
            )
            return
        reps = PAIRS[size]
        progress(f"{RUNTIME_VS_BASELINE}: baseline {commit[:12]} and this tree, alternately, {reps} time(s)")
        baseline_runs, current_runs = [], []
        for rep in range(reps):
            out = Path(scratch) / f"figures-{rep}.json"
            baseline_runs.append(await asyncio.to_thread(measure, package, size, out))
            current_runs.append(await asyncio.to_thread(measure, None, size, out))
        recorder.add(compare(baseline_runs, current_runs, commit))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", type=Path, required=True, help="write this subprocess's figures here")
    parser.add_argument("--size", choices=["smoke", "quick", "full"], default="quick")
    args = parser.parse_args(argv)
    figures = asyncio.run(_measure(args.size))
    args.measure.write_text(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
