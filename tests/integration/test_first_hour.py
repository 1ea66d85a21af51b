"""docs/first-hour.md, executed: every `$` line of its console blocks runs for real, in the
page's order, and must print what the page shows.

Two terminals, as on the page. A `make run` line runs in the first, in a new session that
stands in for the terminal (`^C` sends SIGINT to its process group); every other line runs in
the second, one bash that lives for the whole page (its `. .venv/bin/activate` and `export`
last), with nothing about Kafka or keylane in its environment. A command runs with the
addresses the page shows replaced by the ones this run's blocks printed.

What differs between machines is compared loosely: ports, times, pids, the minutes left
before a deadline, and the clone's path (the page's /home/you/keylane is this test's
tmp_path). `...` stands for lines left out. kcat reads partitions in parallel, so a kcat
consumer's lines are compared unordered. A line that reads (a kcat consumer, `keylane
approvals`) runs again until it shows what the page shows, for up to a minute: the agent
answers asynchronously.

How this differs from a newcomer's session, and why: `make run` runs as `make -o install
run` (installing is what `make test` did; it must not rebuild the virtualenv this test runs
in); its Kafka state is in tmp_path/.kafka-local (KEYLANE_KAFKA_STATE, which the second
terminal gets too, so the keylane command's default lookup matches), its metrics and
Prometheus on free ports, the example's ledger in tmp_path; the file the page saves goes to
tmp_path, put on PYTHONPATH, rather than into the clone.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from keylane.testing.processes import free_port
from tests.broker import REPO, local_kafka
from tests.integration.test_make_run import newcomer_env

pytestmark = pytest.mark.kafka

DOC = REPO / "docs" / "first-hour.md"
DOC_CLONE = "/home/you/keylane"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
MAKE_RUN = re.compile(r"^((?:[A-Z_][A-Z0-9_]*=\S+ )*)make run$")
READS = re.compile(r"^(kcat .* -C\b|keylane approvals\b)")
KAFKA_LINE = re.compile(r"^  kafka\s+(\S+)", re.MULTILINE)
VARYING = [
    (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:<port>"),
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"), "<time>"),
    (re.compile(r"kill -INT \d+"), "kill -INT <pid>"),
    (re.compile(r"\b\d+(?:\.\d)? (?:s|min|h|d) before its deadline"), "<duration> before its deadline"),
]
START_TIMEOUT_S = 150
STOP_TIMEOUT_S = 60
READ_AGAIN_FOR_S = 60


@dataclass
class Step:
    """A `$` line and what the page shows it print; ``command`` None is a `^C`."""

    command: str | None
    shown: list[str] = field(default_factory=list)


def page_steps() -> list[Step]:
    steps: list[Step] = []
    for language, block in FENCE.findall(DOC.read_text()):
        if language != "console":
            continue
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append(Step(line[2:]))
            elif line == "^C":
                steps.append(Step(None))
            else:
                assert steps, f"output before any command in {DOC.name}: {line!r}"
                steps[-1].shown.append(line)
    return steps


def page_files() -> dict[str, str]:
    """The Python blocks the page saves, by the name their first line gives (`# name.py`)."""
    files = {}
    for language, block in FENCE.findall(DOC.read_text()):
        name = re.fullmatch(r"# (\w+\.py)", block.split("\n", 1)[0])
        if language == "python" and name:
            files[name.group(1)] = block
    return files


def normalized(lines: list[str]) -> list[str]:
    result = []
    for line in lines:
        for pattern, stand_in in VARYING:
            line = pattern.sub(stand_in, line)
        result.append(line.rstrip())
    return result


def shows(printed: list[str], shown: list[str], *, unordered: bool = False) -> bool:
    """Whether ``printed`` is what the page ``shown``: line for line, a `...` line standing for
    any lines (or none), once :data:`VARYING` is blanked out on both sides."""
    got, want = normalized(printed), normalized(shown)
    if unordered:
        return sorted(got) == sorted(want)
    chunks: list[list[str]] = [[]]
    for line in want:
        if line == "...":
            chunks.append([])
        else:
            chunks[-1].append(line)
    if len(chunks) == 1:
        return got == want
    first, *middle, last = chunks
    at, end = len(first), len(got) - len(last)
    if end < at or got[:at] != first or got[end:] != last:
        return False
    for chunk in middle:
        found = next((i for i in range(at, end - len(chunk) + 1) if got[i : i + len(chunk)] == chunk), None)
        if found is None:
            return False
        at = found + len(chunk)
    return True


def mismatch(command: str | None, printed: list[str], shown: list[str]) -> str:
    return (
        f"{DOC.name}: `{command or '^C'}` printed\n"
        + "\n".join(printed)
        + "\n--- where the page shows\n"
        + "\n".join(shown)
    )


class Shell:
    """The page's second terminal: one bash, read line by line, each command's output and
    exit code told apart by a marker line."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.decode(errors="replace"))
        self.lines.put(None)

    def run(self, command: str, *, timeout_s: float = 60) -> tuple[int, list[str]]:
        """Run ``command`` (stdin from /dev/null) in this shell; its exit code and its lines,
        stdout and stderr as a terminal interleaves them."""
        marker = f"--- done {uuid.uuid4().hex} "
        assert self.proc.stdin is not None
        # The printf's newline ends an unterminated last line; it is taken off again below.
        self.proc.stdin.write(f"{{ {command}\n}} </dev/null\nprintf '\\n{marker}%d\\n' $?\n".encode())
        self.proc.stdin.flush()
        text = ""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"`{command}` did not finish within {timeout_s:.0f}s:\n{text}") from None
            assert line is not None, f"the shell exited during `{command}`:\n{text}"
            if line.startswith(marker):
                return int(line[len(marker) :]), text.removesuffix("\n").splitlines()
            text += line

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.proc.stdout.close()
        self.proc.stdin.close()


@dataclass
class Run:
    """A `make run` of the page, in the first terminal."""

    proc: subprocess.Popen[bytes]
    log: Path
    metrics_port: str


def start_run(assignments: str, tmp_path: Path, number: int) -> Run:
    metrics_port = str(free_port())
    env = {
        **newcomer_env(),
        "KEYLANE_KAFKA_STATE": str(tmp_path / ".kafka-local"),
        "KEYLANE_METRICS_PORT": metrics_port,
        "KEYLANE_EFFECTOR_METRICS_PORT": str(free_port()),
        "KEYLANE_PROMETHEUS_PORT": str(free_port()),
        "SUPPORT_LEDGER": str(tmp_path / "sent-replies.jsonl"),
        "PYTHONPATH": str(tmp_path),
    }
    log = tmp_path / f"make-run-{number}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", f"{assignments}make -o install run"],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Run(proc, log, metrics_port)


def printed_until_running(run: Run, tmp_path: Path) -> list[str]:
    """What the run printed up to the end of its "keylane is running" block (its stop line)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        text = run.log.read_text(errors="replace")
        block = re.search(r"^keylane is running\n(?:.*\n)*?  stop .*\n", text, re.MULTILINE)
        if block:
            return text[: block.end()].replace(str(tmp_path), DOC_CLONE).splitlines()
        assert run.proc.poll() is None, f"make run exited with {run.proc.returncode}:\n{text[-3000:]}"
        assert time.monotonic() < deadline, (
            f"no 'keylane is running' within {START_TIMEOUT_S}s:\n{text[-3000:]}"
        )
        time.sleep(0.2)


def rerouted(run: Run) -> float:
    """keylane_records_rerouted_total of the run's worker, summed over its topics."""
    url = f"http://127.0.0.1:{run.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("keylane_records_rerouted_total")
    )


def interrupt(run: Run, tmp_path: Path) -> list[str]:
    """Ctrl-C in the run's terminal; what it printed from then on, once it exited."""
    offset = run.log.stat().st_size
    os.killpg(run.proc.pid, signal.SIGINT)
    run.proc.wait(timeout=STOP_TIMEOUT_S)
    after = run.log.read_bytes()[offset:].decode(errors="replace").replace(str(tmp_path), DOC_CLONE)
    return after.lstrip("\n").splitlines()  # the terminal shows ^C where the first newline is


@pytest.mark.timeout(600)
def test_the_first_hour_page_runs_as_shown(tmp_path: Path) -> None:
    for name, code in page_files().items():
        (tmp_path / name).write_text(code)
    steps = page_steps()
    assert [s.command for s in steps if s.command and MAKE_RUN.match(s.command)], "the page starts make run"
    shell = Shell({**newcomer_env(), "KEYLANE_KAFKA_STATE": str(tmp_path / ".kafka-local")})
    runs: list[Run] = []
    addresses: dict[str, str] = {}  # the page's broker address -> this run's
    try:
        for step in steps:
            if step.command is None:
                # The page's kcat lines put each event in its key's partition (murmur2), so the
                # worker re-routed nothing.
                assert rerouted(runs[-1]) == 0, "an event of the page took the worker's re-route hop"
                printed = interrupt(runs[-1], tmp_path)
                assert shows(printed, step.shown), mismatch(None, printed, step.shown)
                continue
            started = MAKE_RUN.match(step.command)
            if started:
                runs.append(start_run(started.group(1), tmp_path, len(runs) + 1))
                printed = printed_until_running(runs[-1], tmp_path)
                assert shows(printed, step.shown), mismatch(step.command, printed, step.shown)
                (page_address,) = KAFKA_LINE.findall("\n".join(step.shown))
                (run_address,) = KAFKA_LINE.findall("\n".join(printed))
                addresses[page_address] = run_address
                continue
            command = step.command
            for page_address, run_address in addresses.items():
                command = command.replace(page_address, run_address)
            unordered = command.startswith("kcat ") and " -C " in command
            deadline = time.monotonic() + READ_AGAIN_FOR_S
            while True:
                code, printed = shell.run(command)
                if code == 0 and shows(printed, step.shown, unordered=unordered):
                    break
                if not READS.match(command) or time.monotonic() > deadline:
                    raise AssertionError(f"exit code {code}\n" + mismatch(step.command, printed, step.shown))
                time.sleep(1)
        assert all(run.proc.poll() is not None for run in runs), "the page stops every make run it starts"
    finally:
        shell.close()
        for run in runs:
            if run.proc.poll() is None:
                os.killpg(run.proc.pid, signal.SIGINT)
                try:
                    run.proc.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    os.killpg(run.proc.pid, signal.SIGKILL)
                    run.proc.wait()
        local_kafka().stop(tmp_path / ".kafka-local", quiet=True)
