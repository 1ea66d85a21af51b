"""The `keylane` command's grammar and its one-line operator errors (no broker needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    ["inspect"],
    ["errors"],
    ["errors", "list"],
    ["errors", "show"],
    ["errors", "redrive"],
    ["approve"],
    ["approvals"],
    ["approvals", "list"],
    ["cancel"],
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
            ["effector", "--tools", "examples.support_agent", "--tool-timeout", "-5"],
            "--tool-timeout must be a number of seconds above 0, got -5.0",
        ),
        (
            ["effector", "--tools", "examples.support_agent", "--tool-timeout", "nan"],
            "--tool-timeout must be a number of seconds above 0, got nan",
        ),
        (["errors", "redrive", "--dry-run", "--rate", "nan"], "--rate must be above 0, got nan"),
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
    assert len(out.strip().splitlines()) == 11  # the header and the catalog's ten topics


UNREACHABLE = "127.0.0.1:1"
CANNOT_REACH = (
    f"keylane: cannot reach Kafka at {UNREACHABLE} (KEYLANE_BOOTSTRAP_SERVERS; KafkaConnectionError); "
    "start a local one with 'make run' or 'make broker', or set KEYLANE_BOOTSTRAP_SERVERS / "
    "--bootstrap-servers to a running cluster"
)
AGENT = ["worker", "--agent", "tests.agents.flow:remember"]


def newcomer_env(tmp_path: Path, **variables: str) -> dict[str, str]:
    """A shell with no broker named and no local broker's keylane.env, plus ``variables``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KEYLANE_BOOTSTRAP_SERVERS", "KAFKA_BOOTSTRAP_SERVERS")
    }
    return {**env, "KEYLANE_KAFKA_STATE": str(tmp_path / "no-local-broker"), **variables}


@pytest.mark.parametrize(
    ("args", "variables", "line"),
    [
        (["--bogus"], {}, "keylane: unrecognized arguments: --bogus (see 'keylane --help')"),
        (
            [*AGENT, "--max-in-flight", "8"],
            {},
            "keylane worker: unrecognized arguments: --max-in-flight 8 (see 'keylane worker --help')",
        ),
        (
            ["errors", "redrive", "--id", "x"],
            {},
            "keylane errors redrive: unrecognized arguments: --id x (see 'keylane errors redrive --help')",
        ),
        (
            [],
            {},
            "keylane: missing COMMAND: one of topics, worker, effector, inspect, errors, approve, "
            "approvals, cancel, pause, resume (see 'keylane --help')",
        ),
        (
            ["topics"],
            {},
            "keylane topics: missing ACTION: one of apply, check, list (see 'keylane topics --help')",
        ),
        (["approvals", "list"], {"KEYLANE_BOOTSTRAP_SERVERS": UNREACHABLE}, CANNOT_REACH),
        (["topics", "check"], {"KEYLANE_BOOTSTRAP_SERVERS": UNREACHABLE}, CANNOT_REACH),
        (AGENT, {"KEYLANE_BOOTSTRAP_SERVERS": UNREACHABLE}, CANNOT_REACH),
        (
            ["approve", "--key", "k", "--intent", "i", "--approver", "me"],
            {"KEYLANE_BOOTSTRAP_SERVERS": UNREACHABLE},
            CANNOT_REACH,
        ),
        (
            ["topics", "check"],
            {"KEYLANE_BOOTSTRAP_SERVERS": "127.0.0.1:99999"},
            "keylane: bootstrap servers '127.0.0.1:99999' (KEYLANE_BOOTSTRAP_SERVERS) are not "
            "host:port[,host:port] with ports 1-65535; set KEYLANE_BOOTSTRAP_SERVERS or --bootstrap-servers, "
            "e.g. 127.0.0.1:9092",
        ),
        (
            AGENT,
            {"KEYLANE_LOG_LEVEL": "loud"},
            "keylane: KEYLANE_LOG_LEVEL='loud' is not a log level; "
            "use one of debug, info, warning, error, critical",
        ),
        (
            AGENT,
            {"KEYLANE_METRICS_PORT": "abc"},
            "keylane: KEYLANE_METRICS_PORT='abc' is not a whole number; "
            "set it to one, e.g. KEYLANE_METRICS_PORT=9464",
        ),
        (
            [*AGENT, "--metrics-port", "70000"],
            {},
            "keylane: KEYLANE_METRICS_PORT=70000 is not a port; use 1-65535, or 0 to disable /metrics",
        ),
    ],
    ids=[
        "bogus-option",
        "bogus-worker-option",
        "bogus-option-two-commands-deep",
        "no-command",
        "no-action",
        "approvals-list-no-broker",
        "topics-check-no-broker",
        "worker-no-broker",
        "approve-no-broker",
        "port-99999",
        "log-level-loud",
        "metrics-port-abc",
        "metrics-port-70000",
    ],
)
def test_each_newcomer_mistake_is_one_line_without_traceback(
    args: list[str], variables: dict[str, str], line: str, tmp_path: Path
) -> None:
    result = run_cli(*args, env=newcomer_env(tmp_path, **variables))

    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr.splitlines() == [line]


def test_the_broker_make_run_wrote_is_the_one_the_cli_uses_and_names(tmp_path: Path) -> None:
    state = tmp_path / ".kafka-local"
    state.mkdir()
    (state / "keylane.env").write_text(f"KEYLANE_BOOTSTRAP_SERVERS={UNREACHABLE}\n")

    result = run_cli("topics", "check", env=newcomer_env(tmp_path, KEYLANE_KAFKA_STATE=str(state)))

    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        CANNOT_REACH.replace("KEYLANE_BOOTSTRAP_SERVERS;", f"from {state / 'keylane.env'};", 1)
    ]
