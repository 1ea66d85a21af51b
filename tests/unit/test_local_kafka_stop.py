"""The local launcher's stop leaves nothing that names a stopped broker (no JVM started here):
the keylane command reads <state-dir>/keylane.env when no address is exported."""

from __future__ import annotations

import json
from pathlib import Path

from tests.broker import local_kafka


def write_recorded_cluster(state_dir: Path) -> None:
    """cluster.json and keylane.env as a start writes them, for a node that no longer runs."""
    launcher = local_kafka()
    (node,) = launcher.plan_nodes(state_dir, 1, 40000)  # pid 0: not running
    launcher._write_cluster(launcher.Cluster(state_dir=str(state_dir), nodes=[node]))
    assert json.loads((state_dir / "cluster.json").read_text())["bootstrap"] == "127.0.0.1:40000"
    assert (state_dir / "keylane.env").read_text().startswith("KEYLANE_BOOTSTRAP_SERVERS=127.0.0.1:40000\n")


def test_stop_removes_the_address_and_the_record_and_keeps_the_data(tmp_path: Path) -> None:
    write_recorded_cluster(tmp_path)
    (tmp_path / "node-1").mkdir()
    (tmp_path / "cluster-id").write_text("abc")

    was_running = local_kafka().stop(tmp_path, quiet=True)

    assert was_running is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster-id", "node-1"]


def test_stop_removes_a_keylane_env_nothing_records_as_running(tmp_path: Path) -> None:
    write_recorded_cluster(tmp_path)
    (tmp_path / "cluster.json").unlink()  # as an older launcher's stop left it

    assert local_kafka().stop(tmp_path, quiet=True) is False
    assert list(tmp_path.iterdir()) == []
