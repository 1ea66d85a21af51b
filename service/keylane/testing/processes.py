"""Run keylane processes (or any command) with a log file: start, wait until ready, stop, kill -9."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from keylane.config import Settings

READY_LINE = "[^Worker]: Ready"
"""What Faust's worker logs once its partitions are assigned and its tables recovered."""

READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 60.0
_POLL_S = 0.1
_CARRY = 200  # chars of the text already scanned kept in front of the next read: a line split across reads

_P = TypeVar("_P", bound="ManagedProcess")


class ProcessFailed(RuntimeError):
    """A process exited, logged a fatal line, or was not ready in time; the message ends with its log."""


FREE_PORTS = (10000, 20000)
"""Where ``free_port`` picks: below Linux's ephemeral range (32768-60999 by default), whose ports
the kernel hands to outgoing connections. A port it picked there (``bind(0)``) could be taken
by a client's connection between the probe and the process's own bind: a CI run's ``make run``
lost its effector to "Address already in use" that way. The local brokers take theirs from
20000-32000 (deploy/kafka/local_kafka.py)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago, e.g. for /metrics, outside the
    kernel's ephemeral range (FREE_PORTS); the kernel's pick if none of 200 tries is free."""
    ephemeral = _ephemeral_ports()
    for _ in range(200):
        port = FREE_PORTS[0] + secrets.randbelow(FREE_PORTS[1] - FREE_PORTS[0])
        if port not in ephemeral and port_free(port, host):
            return port
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _ephemeral_ports() -> range:
    """The kernel's ephemeral port range (Linux's default when /proc does not say)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``port`` on ``host`` can be bound now (a default port someone may hold)."""
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True


def settings_env(settings: Settings) -> dict[str, str]:
    """The KEYLANE_* variables that give a keylane process these settings' broker, topic prefix,
    app id, data dir, metrics port and session timeout. Merge them over ``os.environ`` (and put
    your own overrides after them)."""
    return {
        "KEYLANE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "KEYLANE_TOPIC_PREFIX": settings.topic_prefix,
        "KEYLANE_APP_ID": settings.app_id,
        "KEYLANE_DATA_DIR": str(settings.data_dir),
        "KEYLANE_METRICS_PORT": str(settings.metrics_port),
        "KEYLANE_SESSION_TIMEOUT_S": f"{settings.session_timeout_s:g}",
    }


class _LogScan:
    """Reads a log from an offset on, returning only what is new each time (with the end of the
    text returned before, so a marker split across two reads is still found)."""

    def __init__(self, path: Path, offset: int) -> None:
        self.path = path
        self.offset = offset
        self._carry = ""

    def new_text(self) -> str:
        chunk = _read_from(self.path, self.offset)
        self.offset += len(chunk)
        text = self._carry + chunk.decode(errors="replace")
        self._carry = text[-_CARRY:]
        return text


class ReadinessProbe(Protocol):
    """How to tell a started process is ready. One probe object per process."""

    def arm(self, process: ManagedProcess) -> None:
        """Called as the process (re)starts: readiness seen before this start no longer counts."""

    def ready(self, process: ManagedProcess) -> bool:
        """Whether the process is ready now; polled until it is."""


class LogLineProbe:
    """Ready once ``line`` is in the process's log after its latest start, so a restart that
    appends to the same log waits for a new line."""

    def __init__(self, line: str) -> None:
        self.line = line
        self._scan: _LogScan | None = None
        self._seen = False

    def arm(self, process: ManagedProcess) -> None:
        self._scan = _LogScan(process.log_path, process.start_offset)
        self._seen = False

    def ready(self, process: ManagedProcess) -> bool:
        if not self._seen and self._scan is not None:
            self._seen = self.line in self._scan.new_text()
        return self._seen


class ReadyzProbe:
    """Ready once ``GET http://127.0.0.1:<port>/readyz`` answers 200 (service/keylane/stages/
    health.py). A process that is still starting refuses the connection or answers 503."""

    def __init__(self, port: int, *, host: str = "127.0.0.1") -> None:
        self.url = f"http://{host}:{port}/readyz"
        self._seen = False

    def arm(self, process: ManagedProcess) -> None:
        self._seen = False

    def ready(self, process: ManagedProcess) -> bool:
        if not self._seen:
            self._seen = readyz_status(self.url) == 200
        return self._seen


def readyz_status(url: str, *, timeout_s: float = 2.0) -> int | None:
    """The HTTP status ``url`` answers, or None when nothing answers (yet)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - a loopback URL
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return None


class KeylaneReady:
    """The readiness of a keylane worker or effector: its /readyz when it serves a metrics port
    (``--metrics-port N`` in its arguments, else ``KEYLANE_METRICS_PORT`` non-zero in its
    environment), else Faust's READY_LINE in its log (processes run with the port at 0).
    Decided again at every start, from the process's arguments and environment then."""

    def __init__(self) -> None:
        self._probe: ReadinessProbe = LogLineProbe(READY_LINE)

    def arm(self, process: ManagedProcess) -> None:
        port = metrics_port_of(process.argv, process.env)
        self._probe = ReadyzProbe(port) if port else LogLineProbe(READY_LINE)
        self._probe.arm(process)

    def ready(self, process: ManagedProcess) -> bool:
        return self._probe.ready(process)


def metrics_port_of(argv: Sequence[str], env: Mapping[str, str] | None) -> int:
    """The metrics port a keylane process started with ``argv`` and ``env`` (None: this
    process's environment) serves, 0 when none is known: ``--metrics-port`` wins over
    ``KEYLANE_METRICS_PORT``; without either (the built-in default) it counts as unknown,
    since another process may hold that port."""
    value: str | None = None
    for i, arg in enumerate(argv):
        if arg == "--metrics-port" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--metrics-port="):
            value = arg.partition("=")[2]
    if value is None:
        value = (os.environ if env is None else env).get("KEYLANE_METRICS_PORT")
    try:
        return int(value) if value else 0
    except ValueError:
        return 0  # the process refuses the setting at start-up and exits: check() reports it


def keylane_ready() -> ReadinessProbe:
    """The probe for keylane workers and effectors; the one place that decides what "ready"
    means: /readyz on the process's metrics port, or Faust's READY_LINE in the log when it
    serves none (``KeylaneReady``)."""
    return KeylaneReady()


class ManagedProcess:
    """One subprocess, its stdout and stderr appended to ``log_path``.

    ``ready`` tells when a start is complete (None: as soon as it is spawned). A line of
    ``fatal_lines`` in the log makes :meth:`check` fail although the process still runs (one
    that will not make progress any more).
    """

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        log_path: Path,
        *,
        name: str | None = None,
        cwd: str | Path | None = None,
        ready: ReadinessProbe | None = None,
        fatal_lines: Sequence[str] = (),
    ) -> None:
        self.argv = list(argv)
        self.env = env
        self.log_path = Path(log_path)
        self.name = name or Path(self.argv[0]).name
        self.cwd = cwd
        self.probe = ready
        self.fatal_lines = tuple(fatal_lines)
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_offset = 0  # the log's size when the latest start began
        self._fatal_scan: _LogScan | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self: _P, *, wait_ready_s: float = READY_TIMEOUT_S) -> _P:
        """Spawn the process and wait until it is ready; ProcessFailed if it is not."""
        return self.launch().wait_ready(wait_ready_s)

    def launch(self: _P) -> _P:
        """Spawn the process, without waiting for it to be ready."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.start_offset = os.fstat(log.fileno()).st_size
            if self.probe is not None:
                self.probe.arm(self)
            self._fatal_scan = _LogScan(self.log_path, self.start_offset)
            self.proc = subprocess.Popen(
                self.argv,
                env=None if self.env is None else dict(self.env),
                cwd=self.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def wait_ready(self: _P, timeout_s: float = READY_TIMEOUT_S) -> _P:
        """Poll until the process is ready; ProcessFailed when it exits, logs a fatal line, or
        is not ready within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self.is_ready():
            self.check()
            if time.monotonic() > deadline:
                raise ProcessFailed(f"{self.name} not ready within {timeout_s:.0f}s:\n{self.tail()}")
            time.sleep(_POLL_S)
        return self

    def is_ready(self) -> bool:
        """Whether the latest start is complete (by the process's readiness probe)."""
        if self.proc is None:
            return False
        return True if self.probe is None else self.probe.ready(self)

    def check(self) -> None:
        """ProcessFailed if the process exited, or logged one of ``fatal_lines`` since its start."""
        if self.proc is not None and self.proc.poll() is not None:
            raise ProcessFailed(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
        if self._fatal_scan is None or not self.fatal_lines:
            return
        text = self._fatal_scan.new_text()
        for line in self.fatal_lines:
            at = text.find(line)
            if at >= 0:
                raise ProcessFailed(f"{self.name} logged {line!r}:\n{text[max(0, at - 300) : at + 2500]}")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit code (negative: the signal that ended it); None while running or never started."""
        return None if self.proc is None else self.proc.poll()

    def kill9(self) -> None:
        """A crash: SIGKILL, no shutdown code runs. Returns once the process is gone."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """A clean stop: SIGTERM, then SIGKILL if still running after ``timeout_s``. Returns the
        exit code (``-signal.SIGKILL`` when it had to be killed); None if never started."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    # -- the log --------------------------------------------------------------------------

    def log(self) -> str:
        """The whole log file (every start of this process that appended to it)."""
        return _read_from(self.log_path, 0).decode(errors="replace")

    def log_since_start(self) -> str:
        """What the latest start logged."""
        return _read_from(self.log_path, self.start_offset).decode(errors="replace")

    def tail(self, chars: int = 3000) -> str:
        return self.log()[-chars:]

    def follow(self, *, poll_s: float = 0.05) -> Iterator[bytes]:
        """Each line the latest start writes to the log, as it is written (with its newline),
        until the process has exited and every line was read."""
        pending = b""
        offset = self.start_offset
        while True:
            exited = not self.running  # before the read: what it wrote before exiting is read
            chunk = _read_from(self.log_path, offset)
            offset += len(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                yield line + b"\n"
            if exited and not chunk:
                if pending:
                    yield pending
                return
            if not chunk:
                time.sleep(poll_s)


class KeylaneProcess(ManagedProcess):
    """``python -m keylane.cli <args>`` (``keylane worker ...``, ``keylane effector ...``), ready
    by :func:`keylane_ready`. ``module`` runs another module's ``-m`` entry point instead."""

    def __init__(
        self,
        args: Sequence[str],
        env: Mapping[str, str] | None,
        log_path: Path,
        *,
        module: str = "keylane.cli",
        name: str | None = None,
        cwd: str | Path | None = None,
        fatal_lines: Sequence[str] = (),
    ) -> None:
        self.args = list(args)
        self.module = module
        super().__init__(
            [sys.executable, "-m", module, *self.args],
            env,
            log_path,
            name=name or (self.args[0] if self.args else module),
            cwd=cwd,
            ready=keylane_ready(),
            fatal_lines=fatal_lines,
        )


@contextmanager
def running(*processes: _P) -> Iterator[tuple[_P, ...]]:
    """Start the processes in order (each ready before the next starts); stop them all, last
    first, on exit."""
    started: list[ManagedProcess] = []
    try:
        for process in processes:
            started.append(process.start())
        yield processes
    finally:
        for done in reversed(started):
            done.stop()


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as log:
            log.seek(offset)
            return log.read()
    except FileNotFoundError:
        return b""
