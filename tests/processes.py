"""Start keylane processes the way users do (`python -m keylane.cli ...`), for broker tests.

The runner and its readiness probe are keylane.testing.processes; this adds the tests'
environment, the repository as working directory, and clean-up after a failed test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from keylane.config import Settings
from keylane.testing import processes
from keylane.testing.processes import ManagedProcess, ProcessFailed, running, settings_env
from tests.broker import REPO

__all__ = ["KeylaneProcess", "ProcessFailed", "keylane_cli", "process_env", "running", "stop_leftovers"]

_started: list[ManagedProcess] = []


class KeylaneProcess(processes.KeylaneProcess):
    """One `keylane worker` or `keylane effector` process with its log file, run from the
    repository (so `tests.agents...` and `examples...` import) and stopped by stop_leftovers."""

    def __init__(
        self, args: Sequence[str], env: dict[str, str], log_path: Path, *, module: str = "keylane.cli"
    ) -> None:
        super().__init__(args, env, log_path, module=module, cwd=REPO)

    def launch(self) -> KeylaneProcess:
        super().launch()
        _started.append(self)
        return self


def stop_leftovers() -> None:
    """Stop every process a test started and left running (a test that failed half-way):
    one would otherwise spin, reconnecting to a broker that is gone, for the rest of the run."""
    while _started:
        process = _started.pop()
        if process.running:
            process.stop()


def process_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment a test's keylane processes share: its broker, prefix, group and state."""
    return {
        **os.environ,
        **settings_env(settings),
        "KEYLANE_METRICS_PORT": "0",
        "KEYLANE_SESSION_TIMEOUT_S": "6",
        **extra,
    }


def keylane_cli(settings: Settings, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """A `keylane ...` command as an operator runs it against the test's broker, prefix and
    group (``extra``: more environment), from the repository; its exit code and whole output."""
    return python_run(settings, "-m", "keylane.cli", *args, **extra)


def python_run(settings: Settings, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in the test's keylane environment (``keylane_cli``'s), from the
    repository; its exit code and whole output."""
    return subprocess.run(
        [sys.executable, *args],
        env=process_env(settings, **extra),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
