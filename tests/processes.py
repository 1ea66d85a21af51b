"""Start keylane processes the way users do (`python -m keylane.cli ...`), for broker tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from keylane.config import Settings
from tests.broker import REPO

READY = "[^Worker]: Ready"
_started: list[KeylaneProcess] = []


class KeylaneProcess:
    """One `keylane worker` or `keylane effector` process with its log file."""

    def __init__(
        self, args: list[str], env: dict[str, str], log_path: Path, *, module: str = "keylane.cli"
    ) -> None:
        self.args = args
        self.module = module
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, wait_ready_s: float = 90.0) -> KeylaneProcess:
        readies_before = self.log().count(READY) if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, *self.args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        _started.append(self)
        deadline = time.monotonic() + wait_ready_s
        while self.log().count(READY) <= readies_before:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.args[0]} exited with {self.proc.returncode}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.args[0]} not ready within {wait_ready_s}s:\n{self.tail()}")
            time.sleep(0.1)
        return self

    def kill9(self) -> None:
        """A crash: SIGKILL, no shutdown code runs."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        """A clean stop (SIGTERM); returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self) -> str:
        return self.log()[-3000:]


def stop_leftovers() -> None:
    """Stop every process a test started and left running (a test that failed half-way):
    one would otherwise spin, reconnecting to a broker that is gone, for the rest of the run."""
    while _started:
        process = _started.pop()
        if process.proc is not None and process.proc.poll() is None:
            process.stop()


def process_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment a test's keylane processes share: its broker, prefix, group and state."""
    return {
        **os.environ,
        "KEYLANE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "KEYLANE_TOPIC_PREFIX": settings.topic_prefix,
        "KEYLANE_APP_ID": settings.app_id,
        "KEYLANE_DATA_DIR": str(settings.data_dir),
        "KEYLANE_METRICS_PORT": "0",
        "KEYLANE_SESSION_TIMEOUT_S": "6",
        **extra,
    }


@contextmanager
def running(*processes: KeylaneProcess) -> Iterator[tuple[KeylaneProcess, ...]]:
    """Start the processes in order; stop them all (cleanly, if still alive) on exit."""
    started: list[KeylaneProcess] = []
    try:
        for process in processes:
            started.append(process.start())
        yield processes
    finally:
        for process in reversed(started):
            process.stop()
