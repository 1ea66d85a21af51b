"""keylane_ready(), the test runner's readiness probe: /readyz on the process's metrics port
(``--metrics-port`` over KEYLANE_METRICS_PORT), Faust's log line when it serves none."""

from __future__ import annotations

from pathlib import Path

from keylane.stages.health import MetricsServer
from keylane.testing.processes import (
    READY_LINE,
    KeylaneProcess,
    KeylaneReady,
    LogLineProbe,
    ReadyzProbe,
    metrics_port_of,
)


def test_the_metrics_port_a_process_serves() -> None:
    assert metrics_port_of(["worker"], {"KEYLANE_METRICS_PORT": "9500"}) == 9500
    assert metrics_port_of(["worker"], {"KEYLANE_METRICS_PORT": "0"}) == 0
    assert metrics_port_of(["worker"], {}) == 0, "the built-in default may be someone else's"
    assert metrics_port_of(["effector", "--metrics-port", "9501"], {"KEYLANE_METRICS_PORT": "9500"}) == 9501
    assert metrics_port_of(["effector", "--metrics-port=9502"], {"KEYLANE_METRICS_PORT": "9500"}) == 9502
    assert metrics_port_of(["worker", "--metrics-port", "0"], {"KEYLANE_METRICS_PORT": "9500"}) == 0
    assert metrics_port_of(["worker"], {"KEYLANE_METRICS_PORT": "lots"}) == 0


def test_the_probe_is_chosen_at_each_start(tmp_path: Path) -> None:
    with_port = KeylaneProcess(["worker"], {"KEYLANE_METRICS_PORT": "9500"}, tmp_path / "a.log")
    without = KeylaneProcess(["worker"], {"KEYLANE_METRICS_PORT": "0"}, tmp_path / "b.log")

    for process, expected in ((with_port, ReadyzProbe), (without, LogLineProbe)):
        probe = process.probe
        assert isinstance(probe, KeylaneReady)
        probe.arm(process)
        assert isinstance(probe._probe, expected)
    assert isinstance(without.probe, KeylaneReady) and isinstance(without.probe._probe, LogLineProbe)
    assert without.probe._probe.line == READY_LINE


def test_the_readyz_probe_waits_for_a_200(tmp_path: Path) -> None:
    ready: list[str | None] = ["starting"]
    server = MetricsServer(0, healthy=lambda: None, ready=lambda: ready[0], host="127.0.0.1").start()
    try:
        process = KeylaneProcess(["worker"], {"KEYLANE_METRICS_PORT": str(server.port)}, tmp_path / "w.log")
        probe = ReadyzProbe(server.port)
        probe.arm(process)
        assert not probe.ready(process)
        ready[0] = None
        assert probe.ready(process)
    finally:
        server.close()
    assert not ReadyzProbe(server.port).ready(process), "nothing answers: not ready"
