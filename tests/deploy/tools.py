"""The outside tools tests/deploy/ runs, found or failed with the line that installs them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# tool -> the Debian package deploy/install-system-deps.sh installs it from
PACKAGES = {"promtool": "prometheus", "docker-compose": "docker-compose"}


def require(tool: str) -> str:
    """The tool's path; a test without it fails (never skips), saying how to install it."""
    path = shutil.which(tool)
    if path is None:
        pytest.fail(
            f"{tool} is not on PATH: run deploy/install-system-deps.sh "
            f"(apt-get install {PACKAGES.get(tool, tool)}) and retry",
            pytrace=False,
        )
    return path


def run(argv: list[str], cwd: Path = REPO, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def explain(result: subprocess.CompletedProcess[str]) -> str:
    return f"{' '.join(result.args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
