"""The Maven-jar launcher starts a real 3-node KRaft cluster and stops it without leftovers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.broker import local_kafka

pytestmark = pytest.mark.kafka


def test_three_node_cluster_starts_serves_and_stops(tmp_path: Path) -> None:
    launcher = local_kafka()

    cluster = launcher.start(tmp_path, nodes=3, quiet=True)
    try:
        for node in cluster.nodes:
            assert sorted(launcher.metadata_brokers("127.0.0.1", node.port)) == [1, 2, 3]
        assert launcher.running_cluster(tmp_path) == cluster
    finally:
        assert launcher.stop(tmp_path, quiet=True) is True

    for node in cluster.nodes:
        with pytest.raises(ProcessLookupError):
            os.kill(node.pid, 0)
    assert launcher.running_cluster(tmp_path) is None
