"""`make bench`: run every benchmark, write bench/out/results.json, bench-report.md and plots.

    python -m bench.run --size full     # make bench (about 30 minutes on 2 cores)
    python -m bench.run --size quick    # make bench-quick (about 8 minutes)

The full run's recovery benchmarks (bench/recovery.py) take about 10 of its minutes, 8 of them
for 100,000 keys; BENCH_RECOVERY_KEYS=10000 leaves that size out.

The broker comes from KAFKA_BOOTSTRAP_SERVERS, else a local Kafka 3.9 started from the
Maven jars for the run (deploy/kafka/local_kafka.py) and stopped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from bench.harness import Recorder, Size, progress
from bench.report import write_report
from bench.runtime import run_runtime_benchmarks
from bench.runtime_baseline import run_baseline_comparison

REPO = Path(__file__).resolve().parent.parent


def local_kafka() -> ModuleType:
    spec = importlib.util.spec_from_file_location("local_kafka", REPO / "deploy" / "kafka" / "local_kafka.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["local_kafka"] = module
    spec.loader.exec_module(module)
    return module


@contextmanager
def bench_broker(purpose: str) -> Iterator[str]:
    """The bootstrap address of KAFKA_BOOTSTRAP_SERVERS, else of a local Kafka started for
    ``purpose`` (said in the progress line) and stopped when the block ends."""
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if bootstrap:
        yield bootstrap
        return
    launcher = local_kafka()
    state_dir = Path(tempfile.mkdtemp(prefix="keylane-bench-kafka-"))
    progress(f"starting a local Kafka for {purpose}")
    try:
        yield launcher.start(state_dir, nodes=1, quiet=True).bootstrap
    finally:
        launcher.stop(state_dir, quiet=True)


async def run(size: Size, out_dir: Path, report: Path) -> None:
    from bench.broker import run_broker_benchmarks
    from bench.lanes import run_lanes_benchmarks
    from bench.recovery import run_recovery_benchmarks
    from bench.state_growth import run_state_growth_benchmarks

    recorder = Recorder(out_dir, size=size)
    await run_runtime_benchmarks(recorder, size=size)
    await run_baseline_comparison(recorder, size=size)
    with bench_broker("the broker benchmarks") as bootstrap:
        await run_broker_benchmarks(recorder, size=size, bootstrap=bootstrap)
        await run_lanes_benchmarks(recorder, size=size, bootstrap=bootstrap)
        await run_state_growth_benchmarks(recorder, size=size, bootstrap=bootstrap)
        await run_recovery_benchmarks(recorder, size=size, bootstrap=bootstrap)
    elapsed = recorder.save()
    write_report(recorder.results, size=size, elapsed_s=elapsed, out_dir=out_dir, path=report)
    progress(f"wrote {report} and {out_dir / 'results.json'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run keylane's benchmarks and write bench-report.md.")
    parser.add_argument("--size", choices=["smoke", "quick", "full"], default="full")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out", help="results.json and plots")
    parser.add_argument("--report", type=Path, default=REPO / "bench-report.md")
    args = parser.parse_args(argv)
    asyncio.run(run(args.size, args.out, args.report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
