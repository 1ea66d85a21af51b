"""What every benchmark produces: a named Result with samples or a rate, saved as JSON.

Benchmarks are not tests. They measure; bench/gate.py judges ratios measured in one run.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Size = Literal["smoke", "quick", "full"]

REPETITIONS: dict[Size, int] = {"smoke": 1, "quick": 3, "full": 3}
"""How many times each benchmark measures its headline figure at each size (smoke runs once:
it checks the harness, not the figures)."""
SPREAD_LIMIT = 0.15
"""A figure whose repetitions spread more than this around their median is flagged unstable."""


class BenchFailure(RuntimeError):
    """A benchmark could not measure what it set out to (said in one message)."""


@dataclass
class Result:
    """One benchmark's outcome.

    ``samples`` are per-operation measurements in ``unit`` (ms for latencies); ``rate`` is a
    throughput in operations per second; ``extra`` holds benchmark-specific figures (ratios,
    spreads, bounds), all JSON-serialisable. ``repetitions`` is the headline figure of each
    repetition (its rate, or the p50 of its samples): ``rate`` is their median, ``samples``
    every repetition's samples together.
    """

    name: str
    unit: str
    samples: list[float] = field(default_factory=list)
    rate: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    repetitions: list[float] = field(default_factory=list)

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the repetitions; None with fewer than two."""
        return spread(self.repetitions)

    @property
    def unstable(self) -> bool:
        """The repetitions disagree by more than SPREAD_LIMIT: the figure is not one to trust."""
        measured = self.spread
        return measured is not None and measured > SPREAD_LIMIT

    def summary(self) -> dict[str, Any]:
        """median, p50, p99, n (of samples) and rate, as the report's tables show them."""
        out: dict[str, Any] = {
            "name": self.name,
            "unit": self.unit,
            "n": len(self.samples),
            "rate": self.rate,
            "repetitions": len(self.repetitions),
            "spread": self.spread,
        }
        if self.samples:
            ordered = sorted(self.samples)
            out.update(
                median=statistics.median(ordered),
                p50=percentile(ordered, 50),
                p99=percentile(ordered, 99),
                mean=statistics.fmean(ordered),
            )
        return out


def spread(values: list[float]) -> float | None:
    """(max - min) / median of ``values``: how far repetitions of one figure disagree, as a
    fraction of the figure. None with fewer than two values or a zero median."""
    if len(values) < 2:
        return None
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle else None


def percentile(ordered: list[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted samples."""
    if not ordered:
        raise ValueError("no samples")
    rank = max(1, min(len(ordered), round(pct / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


class Recorder:
    """Collects Results and writes them to ``<out>/results.json`` as they arrive."""

    def __init__(self, out_dir: Path, *, size: Size) -> None:
        self.out_dir = out_dir
        self.size = size
        self.results: dict[str, Result] = {}
        self.started = time.monotonic()
        out_dir.mkdir(parents=True, exist_ok=True)

    def add(self, result: Result) -> Result:
        self.results[result.name] = result
        self.save()
        summary = result.summary()
        shown = ", ".join(
            f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
            for k, v in summary.items()
            if k in ("n", "rate", "p50", "p99", "spread") and v is not None
        )
        progress(f"done {result.name}: {shown}")
        return result

    def save(self) -> float:
        """Write results.json; returns the seconds since the run started."""
        elapsed = time.monotonic() - self.started
        payload = {
            "size": self.size,
            "elapsed_s": elapsed,
            "results": {name: asdict(r) for name, r in self.results.items()},
        }
        (self.out_dir / "results.json").write_text(json.dumps(payload, indent=1))
        return elapsed


def load_results(path: Path) -> tuple[str, dict[str, Result]]:
    """(size, results by name) from a results.json."""
    raw = json.loads(path.read_text())
    return raw["size"], {name: Result(**r) for name, r in raw["results"].items()}


def progress(message: str) -> None:
    """One progress line on stderr, with the time since the run started."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


Step = tuple[str, Callable[[], Awaitable[None]]]
"""A label and the coroutine function that measures it."""


async def run_steps(
    what: str, steps: Iterable[Step], *, after_each: Callable[[], Awaitable[None]], logs: Path
) -> None:
    """Run every step, even after one failed, awaiting ``after_each`` after each; then raise
    the first failure as a BenchFailure saying how many ``what`` failed (the results that
    were measured are already recorded)."""
    failures: list[tuple[str, BaseException]] = []
    for label, step in steps:
        try:
            await step()
        except Exception as exc:  # noqa: BLE001 - reported here, raised after the other steps
            failures.append((label, exc))
            progress(f"FAILED {label}: {type(exc).__name__}: {exc}")
            traceback.print_exc(file=sys.stderr)
        finally:
            await after_each()
    if failures:
        label, first = failures[0]
        raise BenchFailure(
            f"{len(failures)} {what} failed, first {label}: {first}; logs in {logs}"
        ) from first
