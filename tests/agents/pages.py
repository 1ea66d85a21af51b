"""A paged-memory agent for kill -9 tests of memory that empties.

``fill:<n>`` sets PAGE_FILL_ENTRIES entries of about 1 KiB, each naming ``n`` (24 KiB in all:
the memory is paged); ``clear:<anything>`` deletes every entry (the memory empties, and the
key goes back to one record). Every output reports the memory the activation found, as a
digest of its entries, so a check can tell what each activation read: an output is
{key, event, found, entries}.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from keylane import ActivationContext, Complete
from keylane.core.key_states import KeyStates

PAGE_FILL_ENTRIES = 24
EXIT_AFTER_WRITING = "PAGES_EXIT_AFTER_WRITING"
"""Set to ``<event>,<marker file>``: the worker process exits (code 137, no shutdown) right
after the table write of that event's activation, before any of its changelog records left,
the first time only (the marker file says it happened): a kill -9 at the one point where the
local store holds writes its changelog never got."""


def filled(version: str) -> dict[str, str]:
    """The memory ``fill:<version>`` leaves."""
    return {f"page-{i:02d}": f"{version}:{i}:".ljust(1000, "~") for i in range(PAGE_FILL_ENTRIES)}


def digest(entries: dict[str, str]) -> str:
    """A digest of a memory's entries (names and values)."""
    sha = hashlib.sha256()
    for name in sorted(entries):
        sha.update(f"{name}\0{entries[name]}\0".encode())
    return sha.hexdigest()[:16]


def fill_and_clear(key: bytes, rounds: int) -> list[str]:
    """``fill:<key>-<r>``, ``clear:<key>-<r>`` for each round (every event unique); a key whose
    number (``doc-<n>``) is odd ends filled, with one more fill."""
    name = key.decode()
    events = [e for r in range(rounds) for e in (f"fill:{name}-{r}", f"clear:{name}-{r}")]
    return events + ([f"fill:{name}-last"] if int(name.split("-")[1]) % 2 else [])


def expected_found(events: list[str]) -> list[str]:
    """What each of a key's events finds (its output's ``found``): the memory the event before
    it left."""
    found: list[str] = []
    memory: dict[str, str] = {}
    for event in events:
        found.append(digest(memory))
        command, _, version = event.partition(":")
        memory = filled(version) if command == "fill" else {}
    return found


def found_by_event(outputs: dict[str, set[bytes]]) -> dict[tuple[str, str], str]:
    """(key, event): the memory digest its activation found, from outputs by id (one each)."""
    found: dict[tuple[str, str], str] = {}
    for values in outputs.values():
        assert len(values) == 1, f"one output per id: {values}"
        output = json.loads(next(iter(values)))
        found[(output["key"], output["event"])] = output["found"]
    return found


_exit_after: tuple[str, Path] | None = None
_exiting = False
if os.environ.get(EXIT_AFTER_WRITING):
    _event, _, _marker = os.environ[EXIT_AFTER_WRITING].partition(",")
    _exit_after = (_event, Path(_marker))
    _write = KeyStates.write

    def _write_then_exit(self: KeyStates, *args: Any, **kwargs: Any) -> int:
        written = _write(self, *args, **kwargs)
        if _exiting:
            assert _exit_after is not None
            _exit_after[1].touch()
            os._exit(137)
        return written

    KeyStates.write = _write_then_exit  # type: ignore[method-assign]


async def agent(ctx: ActivationContext) -> Complete:
    global _exiting
    found = {name: ctx.memory.get(name) for name in ctx.memory.keys()}  # noqa: SIM118 (Memory is no dict)
    event = ctx.event.decode()
    if _exit_after is not None and event == _exit_after[0] and not _exit_after[1].exists():
        _exiting = True
    command, _, version = event.partition(":")
    if command == "fill":
        for name, value in filled(version).items():
            ctx.memory.set(name, value)
    elif command == "clear":
        for name in list(ctx.memory.keys()):
            ctx.memory.delete(name)
    output = {"key": ctx.entity_key.decode(), "event": event, "found": digest(found), "entries": len(found)}
    return Complete(output=json.dumps(output, sort_keys=True).encode())
