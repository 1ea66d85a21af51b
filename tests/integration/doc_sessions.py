"""Run a console session of docs/operations.md against a real deployment and check that each
command prints what the page shows (the runbook's transcripts, executed).

A session is the first ```console block after a heading. Each `$` line runs in bash from the
repository, with ``keylane`` as this interpreter's CLI and ``-t agent.X`` under the test's
topic prefix; its stdout and stderr must match the lines that follow it, where `...` stands
for any lines, runs of spaces count as one (columns widen with their values), the test's
topic prefix is left out, and ``<id>``, ``<n>``, ``<time>`` and ``<text>`` stand for what
differs between runs. A `keylane inspect` or `keylane errors list` line reads what a worker
writes asynchronously: it runs again until it shows what the page shows, for up to a minute.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

from keylane.config import Settings
from tests.broker import REPO

OPERATIONS = REPO / "docs" / "operations.md"
PLACEHOLDERS = {
    "<id>": "[0-9a-f-]{36}",
    "<n>": r"-?[0-9]+(?:\.[0-9]+)?",
    "<time>": r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d",
    "<text>": ".*",
}
READS = ("keylane inspect", "keylane errors list")


def session(heading: str, doc: Path = OPERATIONS) -> list[tuple[str, list[str]]]:
    """The `$` lines of the first console block after ``heading``, each with what it shows."""
    section = doc.read_text().split(f"\n{heading}\n", 1)[1]
    block = section.split("```console\n", 1)[1].split("```", 1)[0]
    lines: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            lines.append((line[2:], []))
        else:
            lines[-1][1].append(line)
    return lines


def shows(expected: list[str], printed: str) -> bool:
    """Whether ``printed`` is what ``expected`` shows (see the module docstring)."""
    pattern = ""
    for line in expected:
        if line == "...":
            pattern += r"(?:[^\n]*\n)*?"
            continue
        escaped = re.escape(" ".join(line.split()))
        for placeholder, regex in PLACEHOLDERS.items():
            escaped = escaped.replace(re.escape(placeholder), regex)
        pattern += escaped + r"\n"
    collapsed = "".join(" ".join(line.split()) + "\n" for line in printed.splitlines())
    return re.fullmatch(pattern, collapsed) is not None


async def run_session(heading: str, settings: Settings, env: dict[str, str]) -> None:
    """Run the session under ``heading`` (see the module docstring); fail on the first
    command that does not print what the page shows."""
    for command, expected in session(heading):
        line = re.sub(r"^keylane ", f"{sys.executable} -m keylane.cli ", command)
        line = line.replace(" -t agent.", f" -t {settings.topic_prefix}agent.")
        deadline = time.monotonic() + 60
        while True:
            done = await asyncio.to_thread(
                subprocess.run,
                ["bash", "-c", line],
                env=env,
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=120,
            )
            printed = (done.stdout + done.stderr).replace(settings.topic_prefix + "agent.", "agent.")
            if shows(expected, printed) or not command.startswith(READS) or time.monotonic() > deadline:
                break
            await asyncio.sleep(1)
        page = "\n".join(expected)
        assert shows(expected, printed), f"$ {command}\nprinted:\n{printed}\nthe page shows:\n{page}"
