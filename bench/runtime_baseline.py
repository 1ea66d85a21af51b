"""keylane's own cost against the baseline commit's, measured in the same run.

Two targets of bench/targets.py halve what an activation cost before issue 24's work:
keylane's own cost (overhead_50ms p50 - timer_baseline_50ms p50) and the suspension round
trip. bench/baseline.json stores those figures as measured on the development machine; on a
machine (or an hour) twice as slow, comparing with them says more about the machine than
about keylane. So the run measures the baseline too, here and now: the keylane package of the
commit bench/baseline.json names (``git archive``; no checkout or install), under this tree's
harness (bench/runtime.py), so both are timed by the same code.

The two packages run in two subprocesses that live through the whole comparison and take
turns, a chunk of work at a time (``Side``). A shared machine's speed moves in windows of a
second or more: a pure-Python loop here took 4.1 ms in some windows and 6.6-6.9 ms in others,
with nothing else running, and one suspension round trip's p50 moved between 0.094 and
0.14 ms with it. Figures measured in separate subprocesses, seconds apart, compared one
window with another. So each round measures both sides back to back, the side that goes first
alternating; a round's ratio compares figures taken within a second or two of each other, and
the result keeps the median of the rounds' ratios.

The own cost is a difference of two figures of about 0.7 and 0.4 ms: how late an activation
that waited 50 ms on its model ends (overhead_50), less how late a plain 50 ms sleep wakes
(timer_baseline). The second moves with the machine's window, not with keylane: in one full
run, back-to-back half-second timer chunks gave p50s anywhere from 0.13 to 0.55 ms, and this
tree's own cost, taken from its overhead chunk less the mean of timer chunks around it, came
out between -0.03 and 0.68 ms from one round to the next. So each side measures both figures
itself, in slices of SLICE samples (about a tenth of a second each) taking turns
(``own_cost_samples``): its own cost is its overhead p50 less its own timer p50, both from the
same second. Measured that way, the own-cost ratio against the baseline commit came out
0.51-0.60 in seven full runs (two of them `make bench`), where separate chunks had given
0.44-0.70 in six (four of them `make bench`). Single rounds still vary widely (this tree's own
cost ran 0.04-0.97 ms from round to round): the median over the rounds is the figure to read.

Without the commit (a shallow clone) the result says why, and the targets fall back to
bench/baseline.json.

    python -m bench.runtime_baseline --serve   # one side: reads "FIGURE N" lines, answers samples
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import io
import json
import os
import select
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import IO, Any

from bench.harness import Recorder, Result, Size, percentile, progress

REPO = Path(__file__).resolve().parent.parent
BASELINE_PATH = Path(__file__).with_name("baseline.json")
RUNTIME_VS_BASELINE = "runtime_vs_baseline"
ANSWER_TIMEOUT_S = 300
ROUNDS: dict[Size, int] = {"smoke": 1, "quick": 8, "full": 32}
# The rounds are split over this many pairs of subprocesses, the side started first
# alternating: with this tree on both sides and one pair per run, the side started second had
# the lower own cost in most runs (ratios 0.86-1.01 in twelve runs of 30 rounds; started the
# other way round, 1.00-1.10 in three).
SESSIONS: dict[Size, int] = {"smoke": 1, "quick": 2, "full": 4}
# Work per side per round: an own-cost chunk takes about a second (ten keys, ten 50 ms
# activations apiece and as many plain sleeps), a suspension chunk about 30 ms.
OWN_COST = "own_cost"  # a request: overhead_50 and timer_baseline samples, in turns
CHUNK: dict[Size, dict[str, int]] = {
    "smoke": {OWN_COST: 20, "suspension": 50},
    "quick": {OWN_COST: 100, "suspension": 200},
    "full": {OWN_COST: 100, "suspension": 200},
}
SLICE = 20  # own-cost samples per slice: two activations (or sleeps) of each of the ten keys
BASELINE, CURRENT = "baseline", "current"
FREEZE = "freeze"  # a request: collect, then freeze the survivors (gc.freeze)


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


class Side:
    """A subprocess serving one keylane package's samples (``serve``), one chunk per ask."""

    def __init__(self, package: Path | None, stderr: IO[bytes]) -> None:
        path = [str(package)] if package is not None else [str(REPO / "service")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(REPO)])}
        self._stderr = stderr
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench.runtime_baseline", "--serve"],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self.package: str = self._answer()["package"]

    def samples(self, figure: str, count: int) -> Any:
        """``count`` samples of ``figure`` (one of ``serve``'s), in milliseconds: a list, or
        for OWN_COST the overhead_50 and timer_baseline lists by name."""
        assert self._process.stdin is not None
        self._process.stdin.write(f"{figure} {count}\n")
        self._process.stdin.flush()
        return self._answer()

    def p50(self, figure: str, count: int) -> float:
        return percentile(sorted(self.samples(figure, count)), 50)

    def own_cost(self, count: int) -> tuple[float, float]:
        """The p50s of ``count`` overhead_50 and ``count`` timer_baseline samples, taken in
        turns (``own_cost_samples``)."""
        paired = self.samples(OWN_COST, count)
        return percentile(sorted(paired["overhead_50"]), 50), percentile(sorted(paired["timer_baseline"]), 50)

    def _answer(self) -> Any:
        stdout = self._process.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], ANSWER_TIMEOUT_S)
        line = stdout.readline() if ready else ""
        if not line:
            self.close()
            self._stderr.seek(0)
            why = self._stderr.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"runtime baseline measurement failed: {why or 'no answer'}")
        return json.loads(line)

    def close(self) -> None:
        """End the subprocess (its stdin closed: it answers what it was asked and exits)."""
        if self._process.returncode is not None:
            return
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process.stdout.close()


def serve(requests: IO[str], answers: IO[str]) -> None:
    """Answer each ``FIGURE N`` line of ``requests`` with N samples of FIGURE as one JSON line,
    every chunk on the same microsecond-timer loop. No collection before each chunk: a full
    collection walks every object and leaves the next chunk's first round trips on cold
    caches (FREEZE, once after the warm-up, keeps the collector's scans short instead)."""
    import keylane
    from bench import runtime

    samplers = {
        "overhead_50": runtime.overhead_sampler(50),
        "timer_baseline": runtime.timer_lateness,
        "suspension": runtime.suspension_sampler(),
    }
    answers.write(json.dumps({"package": str(Path(keylane.__file__).parent)}) + "\n")
    answers.flush()
    with asyncio.Runner(loop_factory=runtime.select_loop) as runner:
        for request in requests:
            figure, count = request.split()
            samples: list[float] | dict[str, list[float]]
            if figure == FREEZE:
                gc.collect()
                gc.freeze()
                samples = []
            elif figure == OWN_COST:
                samples = own_cost_samples(runner, samplers, int(count))
            else:
                samples = runner.run(samplers[figure](int(count)))
            answers.write(json.dumps(samples) + "\n")
            answers.flush()


def own_cost_samples(
    runner: asyncio.Runner, samplers: dict[str, Callable[[int], Coroutine[Any, Any, list[float]]]], count: int
) -> dict[str, list[float]]:
    """``count`` samples of ``serve``'s overhead_50 sampler and ``count`` of its timer_baseline,
    in slices of SLICE that take turns (overhead first in every other pair): both figures of an
    own cost come from the same second of the machine."""
    paired: dict[str, list[float]] = {"overhead_50": [], "timer_baseline": []}
    sizes = [SLICE] * (count // SLICE) + ([count % SLICE] if count % SLICE else [])
    for index, size in enumerate(sizes):
        order = ["overhead_50", "timer_baseline"] if index % 2 == 0 else ["timer_baseline", "overhead_50"]
        for figure in order:
            paired[figure] += runner.run(samplers[figure](size))
    return paired


def interleaved(sides: dict[str, Side], size: Size, rounds: int) -> dict[str, list[dict[str, Any]]]:
    """``rounds`` rounds of both sides' figures, back to back; each round's figures per side.
    The side that goes first alternates; each side's own cost is its overhead_50 p50 less its
    timer_baseline p50, measured in turns (``Side.own_cost``)."""
    chunk = CHUNK[size]
    for side in sides.values():  # warm-up, discarded, then what survived it out of the collector's scans
        for figure, count in chunk.items():
            side.samples(figure, count)
        side.samples(FREEZE, 0)
    figures: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for index in range(rounds):
        order = [BASELINE, CURRENT] if index % 2 == 0 else [CURRENT, BASELINE]
        own = {name: sides[name].own_cost(chunk[OWN_COST]) for name in order}
        suspension = {name: sides[name].p50("suspension", chunk["suspension"]) for name in order}
        for name, side in sides.items():
            overhead, wake_up = own[name]
            figures[name].append(
                {
                    "package": side.package,
                    "overhead_50ms_p50_ms": overhead,
                    "timer_baseline_p50_ms": wake_up,
                    "own_cost_ms": overhead - wake_up,
                    "suspension_roundtrip_p50_ms": suspension[name],
                }
            )
    return figures


def measure_both(package: Path, size: Size) -> dict[str, list[dict[str, Any]]]:
    """The rounds of ``interleaved`` with the baseline's package and this tree's, over
    SESSIONS[size] pairs of subprocesses started in alternating order."""
    figures: dict[str, list[dict[str, Any]]] = {BASELINE: [], CURRENT: []}
    sessions = SESSIONS[size]
    for session in range(sessions):
        starting = [BASELINE, CURRENT] if session % 2 == 0 else [CURRENT, BASELINE]
        rounds = ROUNDS[size] // sessions + (session < ROUNDS[size] % sessions)
        sides: dict[str, Side] = {}
        with tempfile.TemporaryFile() as baseline_stderr, tempfile.TemporaryFile() as current_stderr:
            stderr = {BASELINE: baseline_stderr, CURRENT: current_stderr}
            try:
                for name in starting:
                    sides[name] = Side(package if name == BASELINE else None, stderr[name])
                measured = interleaved({name: sides[name] for name in (BASELINE, CURRENT)}, size, rounds)
            finally:
                for side in sides.values():
                    side.close()
        for name in figures:
            figures[name] += measured[name]
    return figures


def compare(baseline_runs: list[dict[str, Any]], current_runs: list[dict[str, Any]], commit: str) -> Result:
    """The result: each round's figures side by side, and the medians of their ratios."""
    extra: dict[str, Any] = {"baseline_commit": commit, "baseline": baseline_runs, "current": current_runs}
    figures = (("own_cost_ms", "own_cost_ratio"), ("suspension_roundtrip_p50_ms", "suspension_ratio"))
    for figure, ratio_name in figures:
        pairs = zip(baseline_runs, current_runs, strict=True)
        ratios = [now[figure] / then[figure] for then, now in pairs if then[figure] > 0]
        extra[f"{ratio_name}_by_round"] = ratios
        extra[ratio_name] = statistics.median(ratios) if ratios else None
    return Result(
        name=RUNTIME_VS_BASELINE,
        unit="ratio",
        repetitions=list(extra["suspension_ratio_by_round"]),
        extra=extra,
    )


async def run_baseline_comparison(recorder: Recorder, *, size: Size) -> None:
    """The baseline's package and this tree's, interleaved over ROUNDS[size] rounds."""
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
        rounds = ROUNDS[size]
        progress(f"{RUNTIME_VS_BASELINE}: baseline {commit[:12]} and this tree in turn, {rounds} round(s)")
        figures = await asyncio.to_thread(measure_both, package, size)
        recorder.add(compare(figures[BASELINE], figures[CURRENT], commit))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", required=True, help="answer FIGURE N lines on stdin")
    parser.parse_args(argv)
    serve(sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
