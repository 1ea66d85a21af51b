#!/usr/bin/env python3
"""`make run`: a local Kafka, the catalog's topics, the example agent's worker and the
effector, and a Prometheus scraping both, stopped together by Ctrl-C.

Order: start (or reuse) the broker in $KEYLANE_KAFKA_STATE (default .kafka-local); apply
the topic catalog; start Prometheus (deploy/local_prometheus.py: the `prometheus` binary,
jobs keylane-worker and keylane-effector, the rules in deploy/prometheus/rules/, its data in
<data dir>/prometheus/) on $KEYLANE_PROMETHEUS_PORT (default 9090, or a free port when 9090
is taken; 0: no Prometheus); start the worker (examples/support_agent.py, or $KEYLANE_AGENT)
and the effector, each logging to <data dir>/logs/ (copied to the screen, prefixed with its
name); print where everything is once both are ready (and how to point the `keylane` command at this
broker); wait. On Ctrl-C, SIGINT or SIGTERM the worker and the effector are stopped first
(together), then Prometheus, then the broker, but only if this run started it; a second signal
does not cut that short (each step ends in SIGKILL after its timeout).

SIGINT is re-armed at start: a shell starts a background job (`make run > log &` in a script)
with SIGINT ignored, and Python keeps it ignored. GNU make keeps ignoring it for itself, so
`kill -INT <make's pid>` reaches nobody; the "keylane is running" block names this process's
pid instead. The worker, the effector and Prometheus run in this process's group (Ctrl-C in a
terminal reaches them too); the broker runs in its own session and only `local_kafka.stop`
stops it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from keylane.testing.processes import KeylaneProcess, ManagedProcess, ProcessFailed, free_port, port_free

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "kafka"))

import local_kafka  # noqa: E402  (a script beside this one, not an installed package)
import local_prometheus  # noqa: E402  (deploy/local_prometheus.py, beside this one)

WORKER_STOP_TIMEOUT_S = 30
PROMETHEUS_STOP_TIMEOUT_S = 10
DEFAULT_PROMETHEUS_PORT = 9090
# As deploy/prometheus/prometheus.yml scrapes the compose stack.
SCRAPE_INTERVAL = "5s"
EVALUATION_INTERVAL = "15s"


def main() -> int:
    # Before anything starts: a script's background job begins with SIGINT ignored (above).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    state_dir = Path(os.environ.get("KEYLANE_KAFKA_STATE", local_kafka.DEFAULT_STATE_DIR)).resolve()
    already_running = local_kafka.running_cluster(state_dir)
    try:
        cluster = already_running or local_kafka.start(state_dir, nodes=1, quiet=True)
    except local_kafka.LauncherError as exc:
        print(f"make run: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # start() stops the nodes it launched when it is interrupted.
        print("\nmake run: stopped while kafka was starting", flush=True)
        return 0
    # The cluster's replication factor (3 on `make broker NODES=3`) unless the environment
    # names one: a reused 3-node cluster gets replicated topics without a manual step.
    env = {**local_kafka.keylane_env(cluster), **os.environ, "KEYLANE_BOOTSTRAP_SERVERS": cluster.bootstrap}
    env.setdefault("KEYLANE_DATA_DIR", str(state_dir.parent / ".keylane-data"))
    agent = env.get("KEYLANE_AGENT", "examples.support_agent:agent")
    worker_metrics_port = env.get("KEYLANE_METRICS_PORT", "9464")
    effector_metrics_port = env.get("KEYLANE_EFFECTOR_METRICS_PORT", "9465")
    tools = env.get("KEYLANE_TOOLS", agent.partition(":")[0])
    log_dir = Path(env["KEYLANE_DATA_DIR"]) / "logs"
    commands = {
        "worker": ["worker", "--agent", agent],
        "effector": ["effector", "--tools", tools, "--metrics-port", effector_metrics_port],
    }
    processes = {
        name: KeylaneProcess(args, env, log_dir / f"{name}.log", name=name) for name, args in commands.items()
    }
    prometheus: ManagedProcess | None = None
    try:
        apply_topics = [sys.executable, "-m", "keylane.cli", "topics", "apply"]
        applied = subprocess.run(apply_topics, env=env, check=False)
        if applied.returncode != 0:
            return applied.returncode
        metrics = {"keylane-worker": worker_metrics_port, "keylane-effector": effector_metrics_port}
        try:
            prometheus, prometheus_line = _start_prometheus(env, metrics)
        except (local_prometheus.PrometheusMissing, ProcessFailed, ValueError) as exc:
            print(f"make run: Prometheus did not start: {exc}", file=sys.stderr)
            return 1
        for process in processes.values():
            process.launch()
        where = _where(cluster.bootstrap, state_dir, env, log_dir, reused=already_running is not None)
        where = where.replace("{effector_metrics_port}", effector_metrics_port)
        where = where.replace("{prometheus}", prometheus_line)
        return _relay_output(processes, announce_when_ready=where)
    except KeyboardInterrupt:
        print("\nmake run: stopping", flush=True)
        return 0
    finally:
        _hold_stop_signals()
        _stop_together(list(processes.values()), WORKER_STOP_TIMEOUT_S)
        if prometheus is not None:
            prometheus.stop(PROMETHEUS_STOP_TIMEOUT_S)
        if already_running is None:
            local_kafka.stop(state_dir, quiet=True)
            print(f"make run: kafka at {cluster.bootstrap} stopped", flush=True)


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _hold_stop_signals() -> None:
    """Let a second Ctrl-C or SIGTERM while stopping say so instead of cutting the stop short
    (which would leave the broker, in its own session, running): every step is bounded."""

    def still_stopping(signum: int, frame: object) -> None:
        # os.write, not print: the handler may run in the middle of a print to stdout.
        os.write(sys.stdout.fileno(), b"make run: still stopping (what does not stop in time is killed)\n")

    signal.signal(signal.SIGINT, still_stopping)
    signal.signal(signal.SIGTERM, still_stopping)


def _stop_together(processes: list[KeylaneProcess], timeout_s: float) -> None:
    """SIGTERM every started process at once, then wait for each (SIGKILL after ``timeout_s``):
    their shutdowns overlap instead of adding up."""
    for process in processes:
        if process.proc is not None and process.running:
            with contextlib.suppress(ProcessLookupError):
                process.proc.send_signal(signal.SIGTERM)
    for process in processes:
        process.stop(timeout_s)


def _start_prometheus(
    env: dict[str, str], metrics_ports: dict[str, str]
) -> tuple[ManagedProcess | None, str]:
    """Start Prometheus scraping each job's 127.0.0.1:<port> (a port of 0 serves no metrics and
    gets no target), its configuration, TSDB and log in <data dir>/prometheus/. Returns the
    process (None when $KEYLANE_PROMETHEUS_PORT is 0) and what the "running" block shows."""
    chosen = env.get("KEYLANE_PROMETHEUS_PORT")
    if chosen is not None and not chosen.isdigit():
        raise ValueError(f"KEYLANE_PROMETHEUS_PORT must be a port number (0: no Prometheus), got {chosen!r}")
    port = DEFAULT_PROMETHEUS_PORT if chosen is None else int(chosen)
    if port == 0:
        return None, "off (KEYLANE_PROMETHEUS_PORT=0)"
    note = ""
    if chosen is None and not port_free(port):
        port = free_port()
        note = f" ({DEFAULT_PROMETHEUS_PORT} is taken)"
    targets = {job: [f"127.0.0.1:{p}"] for job, p in metrics_ports.items() if p != "0"}
    config = local_prometheus.scrape_config(
        targets, scrape_interval=SCRAPE_INTERVAL, evaluation_interval=EVALUATION_INTERVAL
    )
    data_dir = Path(env["KEYLANE_DATA_DIR"]) / "prometheus"
    process = local_prometheus.launch(config, data_dir, port=port)
    url = local_prometheus.url(port)
    return process, f"{url}{note} (/targets, /alerts; its data and log in {data_dir})"


def _relay_output(processes: dict[str, KeylaneProcess], *, announce_when_ready: str) -> int:
    """Copy each process's log to our stdout, prefixed with its name; print where things are
    once all are ready, so the addresses are the last thing on screen rather than scrolled
    away by start-up logs (once every line logged up to then is shown: when no line came for
    a moment, or a second after all were ready). Returns when any process exits, with its
    exit code."""
    lines: queue.Queue[tuple[str, bytes | None]] = queue.Queue()
    for name, process in processes.items():
        threading.Thread(target=_pump, args=(name, process, lines), daemon=True).start()
    ready_at: float | None = None
    announced = False
    while True:
        try:
            name, line = lines.get(timeout=0.2)
        except queue.Empty:
            name, line = "", b""
        if line is None:
            print(f"make run: {name} exited", flush=True)
            return processes[name].returncode or 0
        if line:
            sys.stdout.buffer.write(f"[{name}] ".encode() + line)
        if ready_at is None and all(process.is_ready() for process in processes.values()):
            ready_at = time.monotonic()
        if not announced and ready_at is not None and (not line or time.monotonic() - ready_at > 1):
            announced = True
            sys.stdout.buffer.write(announce_when_ready.encode())
        sys.stdout.flush()


def _pump(name: str, process: KeylaneProcess, lines: queue.Queue[tuple[str, bytes | None]]) -> None:
    for line in process.follow():
        lines.put((name, line))
    lines.put((name, None))


def _where(bootstrap: str, state_dir: Path, env: dict[str, str], log_dir: Path, *, reused: bool) -> str:
    prefix = env.get("KEYLANE_TOPIC_PREFIX", "")
    # What the `keylane` command needs to reach this run's topics (it defaults to 127.0.0.1:9092).
    cli_env = f"KEYLANE_BOOTSTRAP_SERVERS={bootstrap}" + (f" KEYLANE_TOPIC_PREFIX={prefix}" if prefix else "")
    return "\n".join(
        [
            "",
            "keylane is running",
            f"  kafka      {bootstrap}{' (already running; left running on exit)' if reused else ''}",
            f"  cli        export {cli_env} (for the keylane command; the address is also in "
            f"{state_dir}/keylane.env)",
            f"  broker log {state_dir}/node-1/server.log",
            f"  state      {env['KEYLANE_DATA_DIR']}",
            f"  logs       {log_dir}/worker.log, {log_dir}/effector.log",
            f"  topics     {prefix}agent.* (keylane topics list)",
            f"  metrics    http://127.0.0.1:{env.get('KEYLANE_METRICS_PORT', '9464')}/metrics (worker), "
            "http://127.0.0.1:{effector_metrics_port}/metrics (effector)",
            "  prometheus {prometheus}",
            # murmur2, as keylane's own producers: the event lands in its key's partition at once
            # instead of taking the worker's re-route hop (librdkafka's default is CRC32).
            f'  produce    echo \'customer-1|{{"v":1,"payload":"I want a refund"}}\' | '
            f"kcat -b {bootstrap} -t {prefix}agent.events -P -K '|' -X partitioner=murmur2_random",
            f"  consume    kcat -b {bootstrap} -t {prefix}agent.output -C -K '|' -o beginning",
            f"  errors     kcat -b {bootstrap} -t {prefix}agent.errors -C -o beginning",
            f"  stop       Ctrl-C, or kill -INT {os.getpid()} (stops the worker, the effector, Prometheus, "
            "and the broker if this run started it)",
            "",
            "",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
