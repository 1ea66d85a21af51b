"""A real Prometheus (the `prometheus` binary on PATH, Debian's package) on 127.0.0.1, scraping
keylane processes with the job names and rules of deploy/prometheus/: used by `make run`
(deploy/run_local.py) and by the tests (tests/prometheus.py).

    config = scrape_config({"keylane-worker": ["127.0.0.1:9464"]}, scrape_interval="1s")
    prometheus = launch(config, data_dir, port=9090)  # a ManagedProcess, ready on /-/ready
    ...
    prometheus.stop()

The configuration is written as JSON, which is YAML, so this needs no YAML library. Its data
(``--storage.tsdb.path``), configuration and log all live under ``data_dir``.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from keylane.testing.processes import ManagedProcess

RULES = Path(__file__).resolve().parent / "prometheus" / "rules"
RULE_FILES = str(RULES / "*.rules.yml")
"""The alert and recording rules, not their promtool tests (keylane.rules.test.yml)."""

READY_TIMEOUT_S = 30.0


class PrometheusMissing(RuntimeError):
    """No `prometheus` binary on PATH."""


def binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        raise PrometheusMissing(
            "no `prometheus` on PATH: `make system-deps` installs it (apt-get install prometheus)"
        )
    return found


def scrape_config(
    targets: Mapping[str, Sequence[str]],
    *,
    scrape_interval: str = "5s",
    evaluation_interval: str | None = None,
    rule_files: Sequence[str] = (RULE_FILES,),
) -> dict[str, Any]:
    """A Prometheus configuration: one scrape job per ``targets`` item (job name -> host:port
    addresses, /metrics), the rules evaluated as often as targets are scraped unless
    ``evaluation_interval`` says otherwise."""
    return {
        "global": {
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "evaluation_interval": evaluation_interval or scrape_interval,
        },
        "rule_files": list(rule_files),
        "scrape_configs": [
            {"job_name": job, "metrics_path": "/metrics", "static_configs": [{"targets": list(addresses)}]}
            for job, addresses in targets.items()
        ],
    }


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def get_json(base_url: str, path: str, params: Mapping[str, str] | None = None, timeout_s: float = 5) -> Any:
    """GET ``base_url + path`` (with a query string from ``params``) and decode its JSON."""
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{base_url}{path}{query}", timeout=timeout_s) as response:  # noqa: S310
        return json.loads(response.read())


def answers_ready(base_url: str) -> bool:
    """Whether Prometheus answers 200 on /-/ready (it has loaded its TSDB and configuration)."""
    try:
        with urllib.request.urlopen(f"{base_url}/-/ready", timeout=2) as response:  # noqa: S310
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class ReadyEndpoint:
    """Ready once /-/ready answers 200 (a ReadinessProbe for ManagedProcess)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._ready = False

    def arm(self, process: ManagedProcess) -> None:
        self._ready = False

    def ready(self, process: ManagedProcess) -> bool:
        if not self._ready:
            self._ready = answers_ready(self.base_url)
        return self._ready


def launch(config: Mapping[str, Any], data_dir: Path, *, port: int) -> ManagedProcess:
    """Write ``config`` to ``data_dir``/prometheus.yml and start Prometheus on 127.0.0.1:``port``
    with its TSDB in ``data_dir``/data, logging to ``data_dir``/prometheus.log; returns once it
    is ready (keylane.testing.processes.ProcessFailed, with its log, if it exits or is not
    ready in time)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    config_file = data_dir / "prometheus.yml"
    config_file.write_text(json.dumps(config, indent=2) + "\n")
    process = ManagedProcess(
        [
            binary(),
            f"--config.file={config_file}",
            f"--storage.tsdb.path={data_dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1d",
        ],
        None,
        data_dir / "prometheus.log",
        name="prometheus",
        ready=ReadyEndpoint(url(port)),
    )
    try:
        return process.start(wait_ready_s=READY_TIMEOUT_S)
    except BaseException:  # not ready in time, or Ctrl-C meanwhile: leave nothing running
        process.stop(5)
        raise
