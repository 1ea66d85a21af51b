"""`make bench-profile`: where a keylane worker's time goes under load, beside a plain Faust
agent doing the same job, both sampled by py-spy.

    python -m bench.profile [--records 20000] [--out bench/out] [--keep-raw]

It deploys a fresh catalog (the broker from KAFKA_BOOTSTRAP_SERVERS, else a local Kafka 3.9
from the Maven jars). Then, one after the other, it starts the plain Faust peer of ``make
bench`` (bench/peers.py: a table write and an output per record) and a keylane worker with the
no-op agent, each on an input topic of its own. Once a process is ready and py-spy reports
that it samples it, the backlog (the same records for both, 1,000 keys) goes into that
process's input, and py-spy samples every thread until the last output. Filling the input
only then is what makes the samples cover the whole backlog: a pre-filled one could be gone
before py-spy attaches (it cannot attach before the interpreter is up), which left a short
run with no sample at all. It writes, in ``--out``:

* ``profile-e2e_noop.svg`` and ``profile-faust_peer.svg``: py-spy's flame graphs;
* ``profile-e2e_noop.txt``: both rates; the CPU each process spent per record (utime and
  stime of /proc/PID/stat over the run, every thread); the Python CPU per record of each
  area, side by side (the area of a sample's innermost frame that belongs to one: Faust's
  stream machinery, the offset guard, lanes, encode/decode, tables and changelog, the
  producer, the consumer's fetch thread, metrics, the agent runtime, asyncio itself); then,
  for each process, the areas' shares and the top frames by own and inclusive samples.

The side-by-side table is what the e2e_noop ratio to the peer is made of: an area where
keylane spends more per record than the peer is work keylane adds to Faust's path.

Only the thread holding the GIL is sampled (``--gil``), so the shares are of the Python CPU
the worker spends. Without it py-spy counted a thread inside a system call as busy, and a
quarter of the samples landed in the socket write of the producer's sends, while the
worker's system time was 5% of its CPU (utime and stime of /proc/PID/stat over a run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.broker import noop_events
from bench.deployment import Testbed, start, stop
from bench.harness import BenchFailure, progress
from bench.producers import produce_all
from bench.reader import Reader, rate_of
from bench.run import REPO, bench_broker
from keylane.catalog import EVENTS, OUTPUT
from keylane.testing.processes import ManagedProcess

NAME = "e2e_noop"
PEER = "faust_peer"
KEYS = 1000
SAMPLE_RATE_HZ = 200
SAMPLING_LINE = b"Sampling process"  # what py-spy record prints once it has attached
SAMPLING_TIMEOUT_S = 30.0

AREAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("metrics", ("prometheus_client/", "keylane/metrics")),
    ("encode/decode", ("keylane/wire", "keylane/records", "json/", "msgpack", "uuid.py")),
    (
        "offset guard and lane feed",
        ("keylane/core/offsets", "keylane/kafka/offset_guard", "keylane/kafka/lane_feed"),
    ),
    ("lanes", ("keylane/core/lanes",)),
    (
        "tables and changelog",
        ("faust/tables/", "faust/stores/", "rocksdict", "keylane/kafka/delivery", "keylane/kafka/epochs"),
    ),
    ("producer", ("aiokafka/producer/", "keylane/kafka/producer", "keylane/kafka/publish", "faust/topics")),
    ("consumer fetch thread", ("aiokafka/consumer/", "faust/transport/drivers/")),
    ("agent runtime", ("keylane/",)),
    ("Faust stream machinery", ("faust/", "mode/")),
)
"""An area per group of file paths: a sample counts for the area of its innermost frame that
matches one (the first match in this order), so a socket write under the producer is the
producer's. A sample in none of them counts for the first of GENERIC_AREAS its innermost
frame matches, else for "other"."""

GENERIC_AREAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("aiokafka protocol and connection", ("aiokafka/", "kafka/protocol")),
    ("asyncio and the event loop", ("asyncio/", "selectors.py")),
)


def _match(frame_file: str, areas: tuple[tuple[str, tuple[str, ...]], ...]) -> str | None:
    for area, markers in areas:
        if any(marker in frame_file for marker in markers):
            return area
    return None


_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str

    @classmethod
    def parse(cls, text: str) -> Frame:
        match = _FRAME.match(text.strip())
        if match is None:
            return cls(text.strip(), "")
        return cls(match["function"], match["file"])

    def label(self) -> str:
        short = self.file.split("site-packages/")[-1].split("/service/")[-1]
        return f"{self.function} ({short})" if short else self.function


def area_of(stack: list[Frame]) -> str:
    """The area of ``stack`` (outermost frame first): see AREAS. Only the frames the event
    loop runs count (below its innermost ``_run_once``): the ones above start the worker."""
    loop = [i for i, frame in enumerate(stack) if frame.function.endswith("_run_once")]
    frames = stack[loop[-1] :] if loop else stack  # _run_once itself is asyncio's
    for areas in (AREAS, GENERIC_AREAS):
        for frame in reversed(frames):
            area = _match(frame.file, areas)
            if area is not None:
                return area
    return "other"


def parse_collapsed(lines: Iterable[str]) -> list[tuple[list[Frame], int]]:
    """py-spy's raw format: one ``frame;frame;...;frame count`` line per distinct stack."""
    stacks = []
    for line in lines:
        line = line.rstrip("\n")
        if not line:
            continue
        stack_text, _, count = line.rpartition(" ")
        frames = [Frame.parse(part) for part in stack_text.split(";") if part]
        # py-spy prefixes each stack with the thread ("process 1:..." / "thread (0x...)")
        frames = [f for f in frames if not f.function.startswith(("process ", "thread "))]
        stacks.append((frames, int(count)))
    return stacks


def summarise(stacks: list[tuple[list[Frame], int]], top: int = 25) -> str:
    total = sum(count for _, count in stacks)
    if not total:
        return "no samples\n"
    areas: Counter[str] = Counter()
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for frames, count in stacks:
        areas[area_of(frames)] += count
        if frames:
            own[frames[-1].label()] += count
        for label in {frame.label() for frame in frames}:
            inclusive[label] += count
    lines = [f"{total} samples (CPU only, every thread)", "", "share by area (innermost frame):"]
    lines += [f"  {100 * n / total:5.1f}%  {area}" for area, n in areas.most_common()]
    lines += ["", f"top {top} frames by own samples:"]
    lines += [f"  {100 * n / total:5.1f}%  {label}" for label, n in own.most_common(top)]
    lines += ["", f"top {top} frames by inclusive samples:"]
    lines += [f"  {100 * n / total:5.1f}%  {label}" for label, n in inclusive.most_common(top)]
    return "\n".join(lines) + "\n"


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise BenchFailure("py-spy is not installed: make install (the bench extra) installs it")
    return found


def sample(pid: int, output: Path, fmt: str) -> subprocess.Popen[bytes]:
    """py-spy on ``pid`` until it gets SIGINT; ``--nonblocking`` leaves the worker running
    between samples, so the profile does not slow what it measures."""
    argv = [
        py_spy(),
        "record",
        "--pid",
        str(pid),
        "--rate",
        str(SAMPLE_RATE_HZ),
        "--threads",
        "--nonblocking",
        "--gil",
    ]
    argv += ["--format", fmt, "--output", str(output)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_sampling(sampler: subprocess.Popen[bytes], timeout_s: float = SAMPLING_TIMEOUT_S) -> None:
    """Return once py-spy says (on stdout) that it samples its process; BenchFailure if it
    exits first or says nothing within ``timeout_s`` (a timer kills it then, which ends the
    blocked read)."""
    assert sampler.stdout is not None
    said = b""
    timer = threading.Timer(timeout_s, sampler.kill)
    timer.start()
    try:
        for line in iter(sampler.stdout.readline, b""):  # its first line once it has attached
            said += line
            if SAMPLING_LINE in line:
                return
    finally:
        timer.cancel()
    sampler.kill()
    rest, err = sampler.communicate()
    text = (said + rest + err).decode(errors="replace")[-500:]
    raise BenchFailure(f"py-spy did not start sampling (exit {sampler.returncode}): {text}")


def finish(sampler: subprocess.Popen[bytes]) -> None:
    sampler.send_signal(signal.SIGINT)
    try:
        _, err = sampler.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        sampler.kill()
        raise BenchFailure("py-spy did not write its profile within 60 s") from None
    if sampler.returncode not in (0, -signal.SIGINT):
        raise BenchFailure(
            f"py-spy failed (exit {sampler.returncode}): {err.decode(errors='replace')[-500:]}"
        )


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of every thread of ``pid`` so far (/proc/PID/stat), or
    None where /proc does not say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Backlog:
    """The records a profiled process works through, and the input they go to."""

    bootstrap: str
    topic: str
    records: Sequence[tuple[bytes, bytes]]


@dataclass
class Sampled:
    """One process's run through the backlog: its output rate, py-spy's stacks and the CPU
    it spent meanwhile."""

    name: str
    records: int
    rate: float
    stacks: list[tuple[list[Frame], int]]
    cpu_s: float | None

    def cpu_ms_per_record(self) -> float | None:
        return None if self.cpu_s is None else 1000 * self.cpu_s / self.records

    def coverage(self, count: int) -> float | None:
        """The share of the process CPU that ``count`` samples stand for (None: CPU unknown)."""
        if not self.cpu_s:
            return None
        return count / SAMPLE_RATE_HZ / self.cpu_s

    def sampled_ms_per_record(self, count: int) -> float:
        """Python CPU per record that ``count`` samples stand for (one per 1/SAMPLE_RATE_HZ s)."""
        return count * 1000 / SAMPLE_RATE_HZ / self.records


async def _through_backlog(
    process: ManagedProcess, reader: Reader, name: str, backlog: Backlog, out: Path, keep_raw: bool = False
) -> Sampled:
    """Start ``process``; once py-spy samples it, fill its input with ``backlog`` and sample
    until ``reader`` saw every record's output. The flame graph goes to
    ``out/profile-<name>.svg``, and with ``keep_raw`` py-spy's raw stacks to
    ``out/profile-<name>.raw`` (one ``frame;...;frame count`` line per stack)."""
    raw, svg = out / f"profile-{name}.raw", out / f"profile-{name}.svg"
    records = len(backlog.records)
    await reader.start()
    await start(process)
    assert process.proc is not None
    pid = process.proc.pid
    samplers = [sample(pid, raw, "raw"), sample(pid, svg, "flamegraph")]
    try:
        for sampler in samplers:
            await asyncio.to_thread(wait_sampling, sampler)
        before = cpu_seconds(pid)
        await produce_all(backlog.bootstrap, backlog.topic, backlog.records)
        outputs = await reader.take(records, timeout_s=60 + records / 100, watch=[process])
        after = cpu_seconds(pid)
    finally:
        for sampler in samplers:
            if sampler.returncode is None:  # not one wait_sampling gave up on
                finish(sampler)
    stacks = parse_collapsed(raw.read_text().splitlines())
    if not keep_raw:
        raw.unlink()
    cpu_s = None if before is None or after is None else after - before
    return Sampled(name, records, rate_of(outputs), stacks, cpu_s)


def compare(ours: Sampled, peer: Sampled) -> str:
    """Both runs side by side: rate, CPU per record, and sampled Python CPU per record by area."""
    by_area: dict[str, Counter[str]] = {}
    for run in (ours, peer):
        areas: Counter[str] = Counter()
        for frames, count in run.stacks:
            areas[area_of(frames)] += count
        by_area[run.name] = areas

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = [
        f"{NAME} (keylane worker, no-op agent): {ours.rate:.0f} records/s over {ours.records} records",
        f"{PEER} (plain Faust agent + table, bench/peers.py): {peer.rate:.0f} records/s, same records",
        "",
        "CPU per record, ms (utime + stime of /proc/PID/stat, every thread, while the backlog ran):",
        f"  keylane {ms(ours.cpu_ms_per_record())}   Faust peer {ms(peer.cpu_ms_per_record())}",
        "",
        f"Python CPU per record by area, ms (GIL samples at {SAMPLE_RATE_HZ} Hz / records):",
        f"  {'area':<34} {'keylane':>8} {'Faust peer':>11}",
    ]
    names = sorted(
        set(by_area[ours.name]) | set(by_area[peer.name]),
        key=lambda area: -(by_area[ours.name][area] + by_area[peer.name][area]),
    )
    for area in names:
        mine = ours.sampled_ms_per_record(by_area[ours.name][area])
        theirs = peer.sampled_ms_per_record(by_area[peer.name][area])
        lines.append(f"  {area:<34} {mine:>8.3f} {theirs:>11.3f}")
    total_ours = sum(by_area[ours.name].values())
    total_peer = sum(by_area[peer.name].values())
    lines.append(
        f"  {'total':<34} {ours.sampled_ms_per_record(total_ours):>8.3f} "
        f"{peer.sampled_ms_per_record(total_peer):>11.3f}"
    )
    covered = [run.coverage(total) for run, total in ((ours, total_ours), (peer, total_peer))]
    if None not in covered:
        lines += [
            "",
            f"The samples stand for {covered[0]:.0%} of keylane's process CPU and {covered[1]:.0%} "
            "of the peer's. The rest is CPU outside the GIL (system calls, RocksDB) and samples",
            "py-spy did not take: on a busy 2-core machine it falls behind its rate (perf, which",
            "samples the CPU itself, put 80% of the worker's CPU in the interpreter). Compare areas",
            "by their shares; the CPU per record above is the whole.",
        ]
    return "\n".join(lines) + "\n"


async def profile(bootstrap: str, records: int, out: Path, keep_raw: bool = False) -> str:
    bed = Testbed(bootstrap)
    # The peer's input is shaped like agent.output, which has agent.events' partition count.
    source, sink = f"{bed.run_id}-profile.peer.events", f"{bed.run_id}-profile.peer.output"
    deployment = await bed.deploy("profile", extra_topics=[source, sink])
    events = noop_events(KEYS, records, "p")
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (once, before the runs)
    try:
        progress(f"profile: {PEER}, {records} records over {KEYS} keys")
        reader = Reader(bootstrap, sink, deployment.partitions(OUTPUT))
        peer_process = bed.peer(deployment, "faust", source, sink)
        try:
            peer = await _through_backlog(
                peer_process, reader, PEER, Backlog(bootstrap, source, events), out, keep_raw
            )
        finally:
            await reader.stop()
            await stop(peer_process)
        progress(f"profile: {NAME}, keylane worker over the same records")
        reader = Reader(bootstrap, deployment.topic(OUTPUT), deployment.partitions(OUTPUT))
        worker = bed.worker(deployment, agent="bench.agents:noop", config="bench.agents:noop_config")
        backlog = Backlog(bootstrap, deployment.topic(EVENTS), events)
        try:
            ours = await _through_backlog(worker, reader, NAME, backlog, out, keep_raw)
        finally:
            await reader.stop()
            await stop(worker)
    finally:
        await bed.stop_all()
        await bed.delete_topics()
    text = compare(ours, peer)
    text += f"\n{NAME} under py-spy ({SAMPLE_RATE_HZ} Hz, non-blocking): "
    text += f"{ours.rate:.0f} records/s over {records} records\n\n{summarise(ours.stacks)}"
    text += f"\n{PEER} under py-spy: {peer.rate:.0f} records/s\n\n{summarise(peer.stacks)}"
    (out / f"profile-{NAME}.txt").write_text(text)
    progress(f"profile: wrote {out}/profile-{{{NAME},{PEER}}}.svg and {out / f'profile-{NAME}.txt'}")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Sample a keylane worker under load with py-spy.")
    parser.add_argument("--records", type=int, default=20_000, help="pre-filled records (default 20,000)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out", help="where the profile goes")
    parser.add_argument(
        "--keep-raw", action="store_true", help="keep py-spy's raw stacks (profile-*.raw) beside the graphs"
    )
    args = parser.parse_args(argv)
    try:
        with bench_broker("the profile") as bootstrap:
            print(asyncio.run(profile(bootstrap, args.records, args.out, args.keep_raw)), end="")
    except BenchFailure as exc:
        print(f"bench-profile: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
