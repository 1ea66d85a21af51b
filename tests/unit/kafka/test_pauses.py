"""PauseWatch against a real pause: a process stopped with SIGSTOP past its threshold and
continued with SIGCONT finds out before its next write; one that only runs does not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# A job starts, waits (as an activation waits on its model), and checks before it writes, as
# AgentProcessor does: it prints the time (CLOCK_MONOTONIC, the same in every process) and the
# verdict of every check.
PROGRAM = """
import sys, time
from pathlib import Path
from keylane.kafka.pauses import PauseWatch
generation_file = Path(sys.argv[1])  # the group generation, as the test sets it
def generation():
    return int(generation_file.read_text())
watch = PauseWatch(session_timeout_s=1.0, generation=generation).start()
started = time.monotonic()
print("ready", flush=True)
while True:
    time.sleep(0.02)
    now = time.monotonic()
    print(now, "interrupted" if watch.interrupted(started, generation()) else "running", flush=True)
"""


def set_generation(generation_file: Path, generation: int) -> None:
    """Write the group generation as one atomic replace: the process reads the file every 20 ms
    and at every tick, and ``write_text`` truncates before it writes, so a read between the two
    found an empty file and crashed the process (about once in 900 rewrites, tried by hand)."""
    staged = generation_file.with_name(generation_file.name + ".next")
    staged.write_text(str(generation))
    os.replace(staged, generation_file)


def run_watch(generation_file: Path, program: str = PROGRAM) -> subprocess.Popen[str]:
    set_generation(generation_file, 3)
    process = subprocess.Popen(
        [sys.executable, "-c", program, str(generation_file)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


def verdicts_for(process: subprocess.Popen[str], seconds: float, *, after: float = 0.0) -> list[str]:
    """The verdicts of the checks the process made within ``seconds``, at or after ``after``."""
    assert process.stdout is not None
    deadline = time.monotonic() + seconds
    seen = []
    while time.monotonic() < deadline:
        at, verdict = process.stdout.readline().split()
        if float(at) >= after:
            seen.append(verdict)
    return seen


def stop(process: subprocess.Popen[str]) -> None:
    os.kill(process.pid, signal.SIGCONT)
    process.kill()
    process.wait()
    assert process.stdout is not None
    process.stdout.close()


@pytest.mark.timeout(30)
def test_a_job_that_started_before_a_long_stop_finds_out_at_its_first_check(tmp_path: Path) -> None:
    process = run_watch(tmp_path / "generation")
    try:
        assert set(verdicts_for(process, 0.5)) == {"running"}
        os.kill(process.pid, signal.SIGSTOP)
        time.sleep(2.0)  # past the 0.8 s threshold (the session timeout less its margin)
        continued = time.monotonic()
        os.kill(process.pid, signal.SIGCONT)
        after = verdicts_for(process, 1.0, after=continued)
    finally:
        stop(process)
    assert after, "the process printed again once continued"
    assert after[0] == "interrupted", f"the very first check after the stop must say so: {after[:5]}"
    assert set(after) == {"interrupted"}, "and every later one for a job that started before it"


@pytest.mark.timeout(30)
def test_a_process_that_keeps_running_is_never_interrupted(tmp_path: Path) -> None:
    process = run_watch(tmp_path / "generation")
    try:
        seen = verdicts_for(process, 2.0)
    finally:
        stop(process)
    assert seen and set(seen) == {"running"}


@pytest.mark.timeout(30)
def test_a_job_that_starts_after_a_long_stop_writes_only_in_a_new_generation(tmp_path: Path) -> None:
    # It starts before the consumer's next heartbeat has told it that the group left its
    # generation: refused under the generation held before the stop, let through once the
    # consumer rejoined under a new one.
    program = PROGRAM.replace(
        "watch.interrupted(started, generation())", "watch.interrupted(time.monotonic(), generation())"
    )
    generation = tmp_path / "generation"
    process = run_watch(generation, program)
    try:
        assert set(verdicts_for(process, 0.5)) == {"running"}
        os.kill(process.pid, signal.SIGSTOP)
        time.sleep(2.0)
        continued = time.monotonic()
        os.kill(process.pid, signal.SIGCONT)
        same_generation = verdicts_for(process, 1.5, after=continued)
        set_generation(generation, 4)  # the consumer rejoined
        rejoined = time.monotonic()
        new_generation = verdicts_for(process, 1.0, after=rejoined + 0.2)
    finally:
        stop(process)
    assert same_generation and set(same_generation) == {"interrupted"}
    assert new_generation and set(new_generation) == {"running"}
