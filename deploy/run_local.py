#!/usr/bin/env python3
"""`make run`: a local Kafka, the catalog's topics and a keylane worker, stopped together by Ctrl-C.

Order: start (or reuse) the broker in $KEYLANE_KAFKA_STATE (default .kafka-local); apply
the topic catalog; start the worker; print where everything is; wait. On Ctrl-C or SIGTERM
the worker is stopped first, then the broker, but only if this run started it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "kafka"))

import local_kafka  # noqa: E402  (a script beside this one, not an installed package)

KEYLANE = [sys.executable, "-m", "service.cli"]
WORKER_STOP_TIMEOUT_S = 30
READY_LINE = b"[^Worker]: Ready"  # Faust's log line once partitions are assigned and recovered


def main() -> int:
    state_dir = Path(os.environ.get("KEYLANE_KAFKA_STATE", local_kafka.DEFAULT_STATE_DIR)).resolve()
    already_running = local_kafka.running_cluster(state_dir)
    try:
        cluster = already_running or local_kafka.start(state_dir, nodes=1, quiet=True)
    except local_kafka.LauncherError as exc:
        print(f"make run: {exc}", file=sys.stderr)
        return 1
    env = {**os.environ, "KEYLANE_BOOTSTRAP_SERVERS": cluster.bootstrap}
    env.setdefault("KEYLANE_DATA_DIR", str(state_dir.parent / ".keylane-data"))
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    worker: subprocess.Popen[bytes] | None = None
    try:
        applied = subprocess.run([*KEYLANE, "topics", "apply"], env=env, check=False)
        if applied.returncode != 0:
            return applied.returncode
        worker = subprocess.Popen(
            [*KEYLANE, "worker"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        where = _where(cluster.bootstrap, state_dir, env, reused=already_running is not None)
        _relay_output(worker, announce_when_ready=where)
        return worker.wait()
    except KeyboardInterrupt:
        print("\nmake run: stopping", flush=True)
        return 0
    finally:
        if worker is not None:
            _stop(worker)
        if already_running is None:
            local_kafka.stop(state_dir, quiet=True)
            print(f"make run: kafka at {cluster.bootstrap} stopped", flush=True)


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=WORKER_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def _relay_output(worker: subprocess.Popen[bytes], *, announce_when_ready: str) -> None:
    """Copy the worker's log to our stdout, and print where things are once it is ready, so
    the addresses are the last thing on screen rather than scrolled away by start-up logs."""
    assert worker.stdout is not None
    announced = False
    for line in worker.stdout:
        sys.stdout.buffer.write(line)
        if not announced and READY_LINE in line:
            sys.stdout.buffer.write(announce_when_ready.encode())
            announced = True
        sys.stdout.flush()


def _where(bootstrap: str, state_dir: Path, env: dict[str, str], *, reused: bool) -> str:
    prefix = env.get("KEYLANE_TOPIC_PREFIX", "")
    return "\n".join(
        [
            "",
            "keylane is running",
            f"  kafka      {bootstrap}{' (already running; left running on exit)' if reused else ''}",
            f"  broker log {state_dir}/node-1/server.log",
            f"  state      {env['KEYLANE_DATA_DIR']}",
            f"  topics     {prefix}agent.* (keylane topics list)",
            f"  produce    echo 'customer-1|hello' | kcat -b {bootstrap} -t {prefix}agent.events -P -K '|'",
            f"  consume    kcat -b {bootstrap} -t {prefix}agent.output -C -K '|' -o beginning",
            "  stop       Ctrl-C (stops the worker and the broker this run started)",
            "",
            "",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
