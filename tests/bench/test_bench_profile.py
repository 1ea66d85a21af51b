"""`make bench-profile`: py-spy samples a real worker working through a backlog on the broker,
and the summary splits the samples by area. No timing is asserted."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.harness import BenchFailure
from bench.profile import (
    NAME,
    PEER,
    Sampled,
    area_of,
    compare,
    cpu_seconds,
    parse_collapsed,
    summarise,
    wait_sampling,
)
from tests.broker import REPO

HEAD = 'process 1:"python -m keylane.cli worker"'
LOOP = "/usr/lib/python3.11/asyncio/base_events.py:1922"
SITE = "/venv/lib/python3.11/site-packages"
STACKS = [
    [
        HEAD,
        "thread (0x7F01)",
        "<module> (keylane/cli.py:10)",
        f"_run_once ({LOOP})",
        "write (/usr/lib/python3.11/asyncio/selector_events.py:1071) 30",
    ],
    [
        HEAD,
        "thread (0x7F01)",
        "_activate (/repo/service/keylane/core/activation.py:300)",
        "encode_state (/repo/service/keylane/core/state.py:80)",
        f"labels ({SITE}/prometheus_client/metrics.py:180) 10",
    ],
    [HEAD, "thread (0x7F02)", f"run ({SITE}/aiokafka/consumer/fetcher.py:400) 60"],
]
RAW = "\n".join(";".join(stack) for stack in STACKS) + "\n"


def test_the_summary_splits_samples_by_their_innermost_area() -> None:
    stacks = parse_collapsed(RAW.splitlines())
    assert [count for _, count in stacks] == [30, 10, 60]
    areas = [area_of(frames) for frames, _ in stacks]
    assert areas == ["asyncio and the event loop", "metrics", "consumer fetch thread"]
    text = summarise(stacks)
    assert text.startswith("100 samples")
    assert "60.0%  consumer fetch thread" in text and "30.0%  asyncio and the event loop" in text
    assert "10.0%  labels (prometheus_client/metrics.py)" in text


def test_the_comparison_sets_each_areas_cpu_per_record_beside_the_peers() -> None:
    stacks = parse_collapsed(RAW.splitlines())  # 100 samples: 1 per 5 ms at 200 Hz, 0.5 s
    ours = Sampled(NAME, records=100, rate=700.0, stacks=stacks, cpu_s=0.2)
    peer = Sampled(PEER, records=100, rate=1400.0, stacks=stacks[2:], cpu_s=0.1)
    text = compare(ours, peer)
    assert "700 records/s over 100 records" in text and "1400 records/s" in text
    assert "keylane 2.00   Faust peer 1.00" in text  # ms of CPU per record
    rows = {
        line.split("  ")[1].strip(): line.split()[-2:] for line in text.splitlines() if line.startswith("  ")
    }
    assert rows["consumer fetch thread"] == ["3.000", "3.000"]  # 60 samples x 5 ms / 100 records
    assert rows["metrics"] == ["0.500", "0.000"]
    assert rows["total"] == ["5.000", "3.000"]
    # 100 samples are 0.5 s against the 0.2 s keylane spent; 60 are 0.3 s against the peer's 0.1 s
    assert "The samples stand for 250% of keylane's process CPU and 300% of the peer's." in text


def test_cpu_seconds_reads_this_process() -> None:
    # /proc counts in clock ticks (10 ms), so a fixed amount of work can fall inside one
    # tick on a fast machine: burn a known amount of this process's CPU instead.
    before, burn_from = cpu_seconds(os.getpid()), time.process_time()
    while time.process_time() - burn_from < 0.3:
        sum(i * i for i in range(10_000))
    after = cpu_seconds(os.getpid())
    assert before is not None and after is not None
    assert after - before >= 0.25  # 0.3 s spent, less a tick of rounding at each end
    assert cpu_seconds(2**22 + 12345) is None  # no such process


@pytest.mark.kafka
@pytest.mark.timeout(300)
def test_a_profile_of_a_worker_under_load_is_written(kafka_bootstrap: str, tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench.profile", "--records", "600", "--out", str(tmp_path)],
        cwd=REPO,
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap},
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    svg, text = tmp_path / "profile-e2e_noop.svg", (tmp_path / "profile-e2e_noop.txt").read_text()
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()[:2000]
    assert "records/s over 600 records" in text and "share by area" in text
    assert "Faust stream machinery" in text, text
    assert "CPU per record, ms" in text and "Python CPU per record by area" in text
    peer_svg = (tmp_path / "profile-faust_peer.svg").read_text()
    assert "<svg" in peer_svg[:2000]
    assert not list(tmp_path.glob("*.raw"))


def _stand_in(script: str) -> subprocess.Popen[bytes]:
    """A process that speaks the way py-spy record does: progress on stdout, errors on stderr."""
    return subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_the_backlog_waits_for_py_spy_to_say_it_samples() -> None:
    sampler = _stand_in("echo 'py-spy> Sampling process 200 times a second.'; exec sleep 30")
    try:
        wait_sampling(sampler, timeout_s=10)
        assert sampler.poll() is None  # still sampling
    finally:
        sampler.kill()
        sampler.communicate()


def test_a_py_spy_that_cannot_attach_fails_the_profile_with_its_words() -> None:
    sampler = _stand_in("echo 'Error: Failed to find python version from target process' >&2; exit 1")
    with pytest.raises(BenchFailure, match=r"did not start sampling .*Failed to find python version"):
        wait_sampling(sampler, timeout_s=10)


def test_a_silent_py_spy_is_given_up_on() -> None:
    sampler = _stand_in("exec sleep 30")
    with pytest.raises(BenchFailure, match="did not start sampling"):
        wait_sampling(sampler, timeout_s=0.5)
    assert sampler.returncode is not None
