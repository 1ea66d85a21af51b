"""The metrics port (service/keylane/stages/health.py): /metrics, /healthz from the event
loop's heartbeat, /readyz with the reason it is not ready (keylane.kafka.app.Readiness), and
the one-line error when the port is taken."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from keylane.errors import ConfigError
from keylane.kafka.app import Readiness
from keylane.kafka.delivery import delivery_guard
from keylane.stages.health import Heartbeat, MetricsServer
from keylane.stages.worker import serve_metrics


def get(port: int, path: str) -> tuple[int, str, str]:
    """(status, content type, body) of GET http://127.0.0.1:port/path."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


class Signal:
    """What Readiness needs of a Faust signal: connect, and send."""

    def __init__(self) -> None:
        self.receivers: list[Callable[..., Awaitable[None]]] = []

    def connect(self, receiver: Callable[..., Awaitable[None]]) -> None:
        self.receivers.append(receiver)

    async def send(self, *args: Any) -> None:
        for receiver in self.receivers:
            await receiver(self, *args, signal=self)


def fake_app() -> SimpleNamespace:
    return SimpleNamespace(
        crashed=False,
        crash_reason=None,
        should_stop=False,
        started=False,
        rebalancing=False,
        tables=SimpleNamespace(recovery=SimpleNamespace(completed=asyncio.Event())),
        on_partitions_assigned=Signal(),
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def server() -> Iterator[tuple[MetricsServer, SimpleNamespace, Clock, Heartbeat]]:
    app, clock = fake_app(), Clock()
    heartbeat = Heartbeat(clock=clock)
    served = MetricsServer(0, healthy=heartbeat.problem, ready=Readiness(app).not_ready, host="127.0.0.1")
    served.start()
    try:
        yield served, app, clock, heartbeat
    finally:
        served.close()


async def test_readyz_says_why_not_until_the_app_is_ready(
    server: tuple[MetricsServer, SimpleNamespace, Clock, Heartbeat],
) -> None:
    served, app, _, _ = server

    async def readyz() -> tuple[int, str]:
        status, content_type, body = await asyncio.to_thread(get, served.port, "/readyz")
        assert content_type.startswith("text/plain")
        return status, body

    assert await readyz() == (503, "starting\n")
    app.started = True
    assert await readyz() == (503, "waiting for the first partition assignment\n")
    await app.on_partitions_assigned.send(set())
    app.rebalancing = True
    assert await readyz() == (503, "rebalancing\n")
    app.rebalancing = False
    assert await readyz() == (503, "recovering tables from their changelogs\n")
    app.tables.recovery.completed.set()
    assert await readyz() == (200, "ready\n")

    app.rebalancing = True  # a later rebalance
    assert await readyz() == (503, "rebalancing\n")
    app.rebalancing = False
    app.should_stop = True  # a signal
    assert await readyz() == (503, "stopping\n")
    app.crashed, app.crash_reason = True, RuntimeError("boom")
    assert await readyz() == (503, "crashed (RuntimeError)\n")
    delivery_guard(app).failure = ConfigError("x")  # type: ignore[assignment]  # any error will do
    assert await readyz() == (503, "a record could not be produced; the process is stopping\n")


def test_healthz_fails_once_the_heartbeat_is_stale(
    server: tuple[MetricsServer, SimpleNamespace, Clock, Heartbeat],
) -> None:
    served, _, clock, heartbeat = server

    assert get(served.port, "/healthz")[::2] == (200, "ok\n"), "healthy until the loop had time to beat"
    clock.now += 31
    assert get(served.port, "/healthz")[::2] == (503, "the event loop has not run for 31s\n")

    loop = asyncio.new_event_loop()
    try:
        heartbeat.start(loop)
        loop.run_until_complete(asyncio.sleep(0.05))  # the loop runs: it beats
    finally:
        loop.close()
    assert get(served.port, "/healthz")[::2] == (200, "ok\n")


def test_metrics_and_unknown_paths(server: tuple[MetricsServer, SimpleNamespace, Clock, Heartbeat]) -> None:
    served = server[0]

    status, content_type, body = get(served.port, "/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=")
    assert "# TYPE keylane_activations_total counter" in body
    assert get(served.port, "/nope")[0] == 404


def test_a_taken_port_is_one_line_naming_the_setting() -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]

        with pytest.raises(ConfigError) as refused:
            serve_metrics(port, healthy=lambda: None, ready=lambda: None)

    assert str(refused.value) == (
        f"cannot serve /metrics on 0.0.0.0:{port} (Address already in use); set KEYLANE_METRICS_PORT "
        "to a free port (0 disables it) and KEYLANE_METRICS_HOST to an address of this machine"
    )
