"""The local launcher's derived layout for an N-node cluster (no JVM started here)."""

from __future__ import annotations

from pathlib import Path

from tests.broker import local_kafka


def test_three_nodes_get_derived_ids_ports_and_dirs(tmp_path: Path) -> None:
    launcher = local_kafka()

    nodes = launcher.plan_nodes(tmp_path, 3, 40000)

    assert [(n.node_id, n.port, n.controller_port) for n in nodes] == [
        (1, 40000, 40001),
        (2, 40002, 40003),
        (3, 40004, 40005),
    ]
    assert len({n.data_dir for n in nodes}) == 3
    props = launcher.server_properties(nodes[1], nodes)
    assert "node.id=2\n" in props
    assert "controller.quorum.voters=1@127.0.0.1:40001,2@127.0.0.1:40003,3@127.0.0.1:40005\n" in props
    assert "offsets.topic.replication.factor=3\n" in props
    assert f"log.dirs={tmp_path}/node-2/data\n" in props
