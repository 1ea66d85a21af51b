"""What `make run` runs (deploy/run_local.py): everything up, then Ctrl-C leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.broker import REPO

pytestmark = pytest.mark.kafka


def wait_for_text(path: Path, text: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        content = path.read_text(errors="replace")
        if text in content:
            return content
        time.sleep(0.2)
    raise AssertionError(f"{text!r} did not appear within {timeout_s}s:\n{path.read_text()[-3000:]}")


def test_run_local_starts_everything_and_ctrl_c_stops_it(tmp_path: Path) -> None:
    state = tmp_path / "kafka"
    log_path = tmp_path / "run.log"
    env = {
        **os.environ,
        "KEYLANE_KAFKA_STATE": str(state),
        "KEYLANE_DATA_DIR": str(tmp_path / "data"),
        "KEYLANE_TOPIC_PREFIX": "makerun.",
        "KEYLANE_APP_ID": "keylane-makerun",
    }
    env.pop("KEYLANE_BOOTSTRAP_SERVERS", None)
    with open(log_path, "wb") as log:
        # A new session stands in for the terminal: Ctrl-C signals its whole process group.
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "deploy" / "run_local.py")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        shown = wait_for_text(log_path, "keylane is running", 90)
        broker_pids = [n["pid"] for n in json.loads((state / "cluster.json").read_text())["nodes"]]
        wait_for_text(log_path, "Worker ready", 60)
        assert "9 created" in shown
        assert "produce    echo 'customer-1|hello' | kcat -b 127.0.0.1:" in shown

        os.killpg(proc.pid, signal.SIGINT)

        assert proc.wait(timeout=60) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "kafka at 127.0.0.1:" in log_path.read_text()
    for pid in broker_pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
