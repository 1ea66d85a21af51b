"""The `keylane` command's grammar and its one-line operator errors (no broker needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from keylane.cli import build_parser, main

SUBCOMMANDS = [
    [],
    ["topics"],
    ["topics", "apply"],
    ["topics", "check"],
    ["topics", "list"],
    ["worker"],
    ["effector"],
    ["approve"],
    ["approvals"],
    ["approvals", "list"],
]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keylane.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


@pytest.mark.parametrize("words", SUBCOMMANDS, ids=lambda w: " ".join(w) or "keylane")
def test_every_subcommand_has_help(words: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*words, "--help"])

    assert exited.value.code == 0
    assert "usage: keylane" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["topics", "apply", "--bogus"], "unrecognized arguments: --bogus"),
        (["topics", "apply", "--topic-prefix", "bad prefix"], "is not a legal Kafka topic prefix"),
        (["topics", "check", "--bootstrap-servers", "not-an-address"], "are not host:port"),
        (["topics", "check", "--bootstrap-servers", "127.0.0.1:1"], "cannot reach Kafka at 127.0.0.1:1"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (
            ["worker", "--agent", "tests.agents.flow:remember", "--provider", "opnai+http://h/v1?model=m"],
            "unknown scheme 'opnai+http'",
        ),
        (
            [
                "worker",
                "--agent",
                "tests.agents.flow:remember",
                "--provider",
                "openai+http://h/v1?api_key=sk-1",
            ],
            "an API key must not be written in the URL",
        ),
    ],
)
def test_operator_errors_are_one_line_without_traceback(args: list[str], expected: str) -> None:
    result = run_cli(*args)

    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert lines[0].startswith("keylane")


def test_bad_environment_value_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KEYLANE_REPLICATION_FACTOR", "three")

    assert main(["topics", "list"]) == 1
    assert capsys.readouterr().err.strip() == (
        "keylane: KEYLANE_REPLICATION_FACTOR='three' is not a whole number; "
        "set it to one, e.g. KEYLANE_REPLICATION_FACTOR=3"
    )


def test_topics_list_shows_the_prefixed_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topics", "list", "--topic-prefix", "prod."]) == 0

    out = capsys.readouterr().out
    assert "prod.agent.events " in out
    assert "prod.agent.errors " in out
    assert len(out.strip().splitlines()) == 10
