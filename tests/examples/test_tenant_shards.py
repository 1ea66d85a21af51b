"""examples/tenant_shards.py against the real broker prints the seed's table: a real kill -9
in run 1, and per-shard recovery decided by the shards' journals in run 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.broker import REPO

pytestmark = pytest.mark.kafka

EXPECTED = """\
TENANT SHARDS (3 shards, 6 tenants, pipeline: extract -> transform -> load)

  run 1 - shard_2 loses power mid-tenant:
    shard_1   completed         6 steps ran
    shard_2   partial_failure   7 steps ran  <- crashed at umbrella:transform
    shard_3   completed         3 steps ran

  run 2 - control plane reruns everything; journals decide what that means:
    shard_1   completed         0 steps ran,  6 skipped (already journaled)
    shard_2   completed         2 steps ran,  7 skipped (already journaled)
    shard_3   completed         0 steps ran,  3 skipped (already journaled)
"""


@pytest.mark.timeout(400)
def test_the_example_prints_the_seeds_table(kafka_bootstrap: str) -> None:
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}

    run = subprocess.run(
        [sys.executable, "examples/tenant_shards.py"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=380,
        check=False,
    )

    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith(EXPECTED), run.stdout
