"""PauseWatch against a real pause: a process stopped with SIGSTOP past its threshold and
continued with SIGCONT finds out before its next write; one that only runs does not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

# A job starts, waits (as an activation waits on its model), and checks before it writes, as
# AgentProcessor does: it prints the time (CLOCK_MONOTONIC, the same in every process) and the
# verdict of every check.
PROGRAM = """
import sys, time
from keylane.kafka.pauses import PauseWatch
watch = PauseWatch(session_timeout_s=1.0).start()
started = time.monotonic()
print("ready", flush=True)
while True:
    time.sleep(0.02)
    now = time.monotonic()
    print(now, "interrupted" if watch.interrupted(started) else "running", flush=True)
"""


def run_watch() -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, text=True, env={**os.environ}
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
def test_a_job_that_started_before_a_long_stop_finds_out_at_its_first_check() -> None:
    process = run_watch()
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
def test_a_process_that_keeps_running_is_never_interrupted() -> None:
    process = run_watch()
    try:
        seen = verdicts_for(process, 2.0)
    finally:
        stop(process)
    assert seen and set(seen) == {"running"}


@pytest.mark.timeout(30)
def test_a_job_that_starts_just_after_a_long_stop_waits_a_session_timeout_to_write() -> None:
    # It starts before the consumer's next heartbeat has told it that it was evicted. Session
    # timeout 2 s: a 3 s stop counts, and a job starting 2 s after it may write again.
    program = PROGRAM.replace("session_timeout_s=1.0", "session_timeout_s=2.0").replace(
        "watch.interrupted(started)",
        "watch.interrupted(time.monotonic())",  # each check: a new job
    )
    process = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    try:
        assert process.stdout.readline().strip() == "ready"
        assert set(verdicts_for(process, 0.5)) == {"running"}
        os.kill(process.pid, signal.SIGSTOP)
        time.sleep(3.0)
        continued = time.monotonic()
        os.kill(process.pid, signal.SIGCONT)
        early = verdicts_for(process, 1.5, after=continued)
        late = verdicts_for(process, 1.5, after=continued + 2.5)
    finally:
        stop(process)
    assert early and set(early) == {"interrupted"}, "within a session timeout of the stop"
    assert late and set(late) == {"running"}, "a session timeout later a new job may write again"
