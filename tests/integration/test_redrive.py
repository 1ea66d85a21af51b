"""`keylane errors redrive` as issue 23 accepts it: a bug turns events into dead letters; once
it is fixed, a re-drive brings each back exactly once and each gets its output; running it
again changes nothing; a record that fails again comes back with its re-drive count and is
quarantined past the limit. Every command runs as an operator runs it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from keylane import ids
from keylane.catalog import ERRORS, EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import read_to_end
from keylane.records import ORIGIN_HEADER, REDRIVE_BY_HEADER, REDRIVE_OF_HEADER, REDRIVES_HEADER
from keylane.wire import AgentEnvelope, ErrorRecord, decode, encode
from tests.kafka_io import produce, wait_for_records
from tests.processes import KeylaneProcess, keylane_cli, process_env, running

pytestmark = pytest.mark.kafka

AUDIT = ("--operator", "ann", "--why", "fixed the decoder")
EVENTS_SENT = [("k-ok", "fine"), ("k-1", "bug-1"), ("k-2", "bug-2"), ("k-3", "bug-3"), ("k-4", "always-4")]


def keylane(settings: Settings, *args: str) -> str:
    """A `keylane` command as an operator runs it; its stdout (it must succeed, silently on stderr)."""
    done = keylane_cli(settings, *args)
    assert (done.returncode, done.stderr) == (0, ""), done.stdout + done.stderr
    return done.stdout


def listed(settings: Settings, *args: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in keylane(settings, "errors", "list", "--json", *args).splitlines()]


async def test_redrive_brings_each_dead_letter_back_once_and_keeps_the_history(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    bug = tmp_path / "bug"
    bug.touch()
    worker = KeylaneProcess(
        ["worker", "--agent", "tests.agents.flaky:agent"],
        process_env(settings, BUG_FLAG=str(bug)),
        tmp_path / "worker.log",
    )
    with running(worker):
        await produce(
            settings,
            catalog.name(EVENTS),
            [(k.encode(), encode(AgentEnvelope(payload=e))) for k, e in EVENTS_SENT],
        )
        await wait_for_records(settings, catalog.name(ERRORS), lambda rs: len(rs) >= 4, timeout_s=90)
        await wait_for_records(settings, catalog.name(OUTPUT), lambda rs: len(rs) >= 1, timeout_s=30)
        first = listed(settings)
        assert sorted((d["key"], d["reason"], d["redrives"], d["status"]) for d in first) == [
            (key, "activation_error", 0, "redrivable") for key in ("k-1", "k-2", "k-3", "k-4")
        ]
        assert [d["key"] for d in listed(settings, "--key", "k-2")] == ["k-2"]
        assert listed(settings, "--reason", "malformed_record") == []
        assert len(listed(settings, "--since", "1h")) == 4
        assert listed(settings, "--since", "2999-01-01T00:00") == []

        bug.unlink()  # the fix
        dry = keylane(settings, "errors", "redrive", "--dry-run")
        assert dry.count("would send") == 4 and dry.endswith(
            "4 would be re-driven, 0 already re-driven, 0 quarantined, 0 cannot be re-driven\n"
        )
        assert len(await read_to_end(settings, catalog.name(EVENTS))) == len(EVENTS_SENT), (
            "a dry run sends nothing"
        )

        # A run cut short after k-1, then the whole run: it resumes where the first stopped.
        assert keylane(settings, "errors", "redrive", "--key", "k-1", *AUDIT).endswith(
            "1 re-driven, 0 already re-driven, 0 quarantined, 0 cannot be re-driven\n"
        )
        rest = keylane(settings, "errors", "redrive", "--max-redrives", "1", "--rate", "20", *AUDIT)
        assert rest.endswith("3 re-driven, 1 already re-driven, 0 quarantined, 0 cannot be re-driven\n"), rest

        outputs = await wait_for_records(
            settings, catalog.name(OUTPUT), lambda rs: len(rs) >= 4, timeout_s=90
        )
        errors = await wait_for_records(settings, catalog.name(ERRORS), lambda rs: len(rs) >= 5, timeout_s=90)
        origin = await read_to_end(settings, catalog.name(EVENTS))

        # Once more: everything is re-driven already or quarantined; nothing is sent.
        again = keylane(settings, "errors", "redrive", "--max-redrives", "1", *AUDIT)
        assert again.endswith("0 re-driven, 4 already re-driven, 1 quarantined, 0 cannot be re-driven\n"), (
            again
        )
        assert len(await read_to_end(settings, catalog.name(EVENTS))) == len(origin)

    redrives = [r for r in origin if REDRIVE_OF_HEADER in r.headers]
    by_id = {d["id"]: d for d in first}
    assert sorted(r.headers[REDRIVE_OF_HEADER].decode() for r in redrives) == sorted(by_id), (
        "each exactly once"
    )
    for record in redrives:
        assert record.headers[REDRIVES_HEADER] == b"1"
        assert record.headers[REDRIVE_BY_HEADER] == b"ann: fixed the decoder", "the audit record"
        assert ORIGIN_HEADER not in record.headers, "a re-drive is a new original, not a copy"
        dead = by_id[record.headers[REDRIVE_OF_HEADER].decode()]
        assert record.key == dead["key"].encode()
        assert record.value == dead["raw_value"]["text"].encode(), "the original bytes"

    shown = [json.loads(r.value or b"") for r in outputs]
    assert sorted(o["event"] for o in shown) == ["bug-1", "bug-2", "bug-3", "fine"], "each fixed event once"
    for record, output in zip(outputs, shown, strict=True):
        assert record.record_id == ids.output_id(output["key"].encode(), output["seq"])

    (failed_again,) = [e for e in (decode(r.value, ErrorRecord) for r in errors) if e.error_id not in by_id]
    always = next(d for d in first if d["key"] == "k-4")
    assert (failed_again.entity_key or "k-4", failed_again.redrives, failed_again.redriven_from) == (
        "k-4",
        1,
        always["id"],
    )
    assert failed_again.origin is not None, "its own origin: the re-drive's position"
    assert failed_again.origin.partition == always["origin"]["partition"]
    assert failed_again.origin.offset > always["origin"]["offset"]

    (quarantined,) = [d for d in listed(settings, "--max-redrives", "1") if d["status"] == "quarantined"]
    assert quarantined["id"] == failed_again.error_id
    shown_always = json.loads(keylane(settings, "errors", "show", always["id"], "--json"))
    assert shown_always["status"] == "redriven"
    history = shown_always["history"]
    assert history["failed_again_as"] == [failed_again.error_id]
    assert [r["count"] for r in history["redriven_as"]] == [1]
    newer = json.loads(keylane(settings, "errors", "show", failed_again.error_id, "--json"))
    assert newer["history"]["redriven_from"] == [always["id"]]
    assert newer["raw_value"] == always["raw_value"]
