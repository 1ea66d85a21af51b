"""Every code block in README.md and docs/ is compiled or checked against what it names.

Python blocks are compiled, and those of the docs that need no broker (EXECUTED_DOCS) are
run, each in a fresh namespace. Shell blocks, and the `$` lines of console transcripts, pass
`bash -n`; every `keylane ...` command in them parses with the real command-line grammar,
every `make X` names a Makefile target, and every script path they run exists. (A transcript
is run for real by its own broker test: docs/first-hour.md by tests/integration/test_first_hour.py,
docs/operations.md's sessions by tests/integration/doc_sessions.py's users.)
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from keylane.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
ENV_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")


def blocks(language: set[str]) -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for number, match in enumerate(FENCE.finditer(doc.read_text()), start=1):
            if match.group(1) in language:
                found.append((f"{doc.relative_to(REPO)}#{number}", match.group(2)))
    return found


def commands(script: str) -> list[list[str]]:
    result = []
    for line in script.splitlines():
        line = re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip()  # a comment, not key#2
        for part in filter(None, (p.strip() for p in split_unquoted(line, "|&;"))):
            words = shlex.split(part)
            while words and ENV_ASSIGNMENT.match(words[0]):
                words = words[1:]
            if words:
                result.append(words)
    return result


def split_unquoted(line: str, separators: str) -> list[str]:
    """``line`` split at each of ``separators`` outside quotes (kcat's `-K '|'` is no pipe)."""
    parts, current, quote = [], "", ""
    for char in line:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in separators:
            parts.append(current)
            current = ""
            continue
        current += char
    return [*parts, current]


def console_commands(transcript: str) -> str:
    """A console transcript's commands (its `$ ` lines), as a script."""
    return "".join(line[2:] + "\n" for line in transcript.splitlines() if line.startswith("$ "))


def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([a-z][a-z0-9-]*):", text, re.MULTILINE))


SHELL_BLOCKS = [
    *blocks({"bash", "sh", "shell"}),
    *((where, console_commands(code)) for where, code in blocks({"console"})),
]
PYTHON_BLOCKS = blocks({"python"})
EXECUTED_DOCS = ("docs/providers.md#", "docs/effector.md#")
EXECUTED_BLOCKS = [(where, code) for where, code in PYTHON_BLOCKS if where.startswith(EXECUTED_DOCS)]


def test_docs_have_code_blocks() -> None:
    assert len(SHELL_BLOCKS) >= 5


def test_python_blocks_compile() -> None:
    for where, code in PYTHON_BLOCKS:
        compile(code, where, "exec")


@pytest.mark.parametrize(("where", "code"), EXECUTED_BLOCKS, ids=[w for w, _ in EXECUTED_BLOCKS])
def test_offline_python_blocks_run(where: str, code: str) -> None:
    exec(compile(code, where, "exec"), {"__name__": "docs_block"})  # noqa: S102 - our own docs


@pytest.mark.parametrize(("where", "script"), SHELL_BLOCKS, ids=[w for w, _ in SHELL_BLOCKS])
def test_shell_blocks_are_valid_and_name_real_things(where: str, script: str) -> None:
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    targets = makefile_targets()
    for words in commands(script):
        if words[0] == "keylane":
            build_parser().parse_args(words[1:])  # exits 2 (fails the test) on a wrong line
        elif words[0] == "make":
            named = [w for w in words[1:] if "=" not in w]
            assert set(named) <= targets, f"{where}: make {named} is not a Makefile target"
        elif words[0] in {"python3", "python"} and len(words) > 1:
            assert (REPO / words[1]).exists(), f"{where}: {words[1]} does not exist"
