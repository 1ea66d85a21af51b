"""The metrics port of a worker or an effector: ``/metrics``, ``/healthz`` and ``/readyz``.

* ``/metrics``: every metric of the process in Prometheus' text format (prometheus_client's
  ``generate_latest`` of its default registry).
* ``/healthz``: 200 ``ok`` while the process's event loop is responsive. A heartbeat on the
  loop stamps the time every ``HEARTBEAT_S``; once the stamp is older than
  ``STALE_AFTER_S`` (an activation that blocks the loop, a deadlock) the answer is 503 with
  how long the loop has not run. A liveness probe: restart the process when it keeps failing.
* ``/readyz``: 200 ``ready`` when the process is ready to process its input
  (``keylane.kafka.app.Readiness``), else 503 with the reason on one line (``starting``,
  ``waiting for the first partition assignment``, ``rebalancing``, ``recovering tables from
  their changelogs``, ``stopping``, ...). A readiness probe, and what a rolling deploy waits for.

Every body is one short line of text. The server runs on daemon threads of its own, so it
answers (503) while the event loop is stuck, and the process exits without stopping it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
"""How often the heartbeat stamps the time on the event loop."""
STALE_AFTER_S = 30.0
"""How long the event loop may go without running the heartbeat before /healthz fails."""

Check = Callable[[], str | None]
"""A health or readiness check: None when fine, else why not, in a few words."""


class Heartbeat:
    """Stamps the time on an event loop every ``interval_s``; ``problem()`` says when the
    stamp went stale. Until the loop runs, the stamp is the heartbeat's creation."""

    def __init__(
        self,
        *,
        interval_s: float = HEARTBEAT_S,
        stale_after_s: float = STALE_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self.stale_after_s = stale_after_s
        self._clock = clock
        self.last = clock()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Beat on ``loop`` from when it runs (callable before it does)."""
        loop.call_soon(self._beat, loop)

    def _beat(self, loop: asyncio.AbstractEventLoop) -> None:
        self.last = self._clock()
        loop.call_later(self.interval_s, self._beat, loop)

    def problem(self) -> str | None:
        """None while the loop beats, else how long it has not."""
        silent = self._clock() - self.last
        if silent <= self.stale_after_s:
            return None
        return f"the event loop has not run for {silent:.0f}s"


class MetricsServer:
    """The three endpoints of the module docstring on ``host:port``, from daemon threads."""

    def __init__(self, port: int, *, healthy: Check, ready: Check, host: str = "0.0.0.0") -> None:  # noqa: S104 - a scrape target
        self._server = ThreadingHTTPServer((host, port), _handler(healthy, ready))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="keylane-metrics", daemon=True
        )

    @property
    def port(self) -> int:
        """The port it listens on (the kernel's pick when it was given 0)."""
        return int(self._server.server_address[1])

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(healthy: Check, ready: Check) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "keylane"

        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, *, body: bool) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST, body=body)
            elif path == "/healthz":
                self._check(healthy, "ok", body=body)
            elif path == "/readyz":
                self._check(ready, "ready", body=body)
            else:
                self._text(404, "not found: /metrics, /healthz or /readyz", body=body)

        def _check(self, check: Check, fine: str, *, body: bool) -> None:
            try:
                problem = check()
            except Exception as exc:  # noqa: BLE001 - a check that fails is a failed check
                problem = f"the check failed: {type(exc).__name__}: {exc}"
            if problem is None:
                self._text(200, fine, body=body)
            else:
                self._text(503, " ".join(problem.split()), body=body)

        def _text(self, status: int, line: str, *, body: bool) -> None:
            self._send(status, f"{line}\n".encode(), "text/plain; charset=utf-8", body=body)

        def _send(self, status: int, payload: bytes, content_type: str, *, body: bool) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if body:
                self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s %s", self.address_string(), format % args)

    return Handler
