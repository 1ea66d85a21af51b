#!/usr/bin/env python3
"""`make run`: a local Kafka, the catalog's topics, the example agent's worker and the
effector, stopped together by Ctrl-C.

Order: start (or reuse) the broker in $KEYLANE_KAFKA_STATE (default .kafka-local); apply
the topic catalog; start the worker (examples/support_agent.py, or $KEYLANE_AGENT) and the
effector; print where everything is once both are ready; wait. On Ctrl-C or SIGTERM the
processes are stopped first, then the broker, but only if this run started it.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "kafka"))

import local_kafka  # noqa: E402  (a script beside this one, not an installed package)

KEYLANE = [sys.executable, "-m", "keylane.cli"]
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
    # The cluster's replication factor (3 on `make broker NODES=3`) unless the environment
    # names one: a reused 3-node cluster gets replicated topics without a manual step.
    env = {**local_kafka.keylane_env(cluster), **os.environ, "KEYLANE_BOOTSTRAP_SERVERS": cluster.bootstrap}
    env.setdefault("KEYLANE_DATA_DIR", str(state_dir.parent / ".keylane-data"))
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    agent = env.get("KEYLANE_AGENT", "examples.support_agent:agent")
    effector_metrics_port = env.get("KEYLANE_EFFECTOR_METRICS_PORT", "9465")
    tools = env.get("KEYLANE_TOOLS", agent.partition(":")[0])
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        applied = subprocess.run([*KEYLANE, "topics", "apply"], env=env, check=False)
        if applied.returncode != 0:
            return applied.returncode
        commands = {
            "worker": [*KEYLANE, "worker", "--agent", agent],
            "effector": [*KEYLANE, "effector", "--tools", tools, "--metrics-port", effector_metrics_port],
        }
        for name, command in commands.items():
            processes[name] = subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
        where = _where(cluster.bootstrap, state_dir, env, reused=already_running is not None)
        where = where.replace("{effector_metrics_port}", effector_metrics_port)
        return _relay_output(processes, announce_when_ready=where)
    except KeyboardInterrupt:
        print("\nmake run: stopping", flush=True)
        return 0
    finally:
        for process in processes.values():
            _stop(process)
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


def _relay_output(processes: dict[str, subprocess.Popen[bytes]], *, announce_when_ready: str) -> int:
    """Copy each process's log to our stdout, prefixed with its name; print where things are
    once all are ready, so the addresses are the last thing on screen rather than scrolled
    away by start-up logs. Returns when any process exits, with its exit code."""
    lines: queue.Queue[tuple[str, bytes | None]] = queue.Queue()
    for name, process in processes.items():
        threading.Thread(target=_pump, args=(name, process, lines), daemon=True).start()
    ready: set[str] = set()
    while True:
        name, line = lines.get()
        if line is None:
            print(f"make run: {name} exited", flush=True)
            return processes[name].wait()
        sys.stdout.buffer.write(f"[{name}] ".encode() + line)
        if READY_LINE in line and name not in ready:
            ready.add(name)
            if ready == set(processes):
                sys.stdout.buffer.write(announce_when_ready.encode())
        sys.stdout.flush()


def _pump(name: str, process: subprocess.Popen[bytes], lines: queue.Queue[tuple[str, bytes | None]]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.put((name, line))
    lines.put((name, None))


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
            f"  metrics    http://127.0.0.1:{env.get('KEYLANE_METRICS_PORT', '9464')}/metrics (worker), "
            "http://127.0.0.1:{effector_metrics_port}/metrics (effector)",
            f'  produce    echo \'customer-1|{{"v":1,"payload":"I want a refund"}}\' | '
            f"kcat -b {bootstrap} -t {prefix}agent.events -P -K '|'",
            f"  consume    kcat -b {bootstrap} -t {prefix}agent.output -C -K '|' -o beginning",
            f"  errors     kcat -b {bootstrap} -t {prefix}agent.errors -C -o beginning",
            "  stop       Ctrl-C (stops the worker, the effector and the broker this run started)",
            "",
            "",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
