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

from keylane import ActivationContext, Complete

PAGE_FILL_ENTRIES = 24


def filled(version: str) -> dict[str, str]:
    """The memory ``fill:<version>`` leaves."""
    return {f"page-{i:02d}": f"{version}:{i}:".ljust(1000, "~") for i in range(PAGE_FILL_ENTRIES)}


def digest(entries: dict[str, str]) -> str:
    """A digest of a memory's entries (names and values)."""
    sha = hashlib.sha256()
    for name in sorted(entries):
        sha.update(f"{name}\0{entries[name]}\0".encode())
    return sha.hexdigest()[:16]


async def agent(ctx: ActivationContext) -> Complete:
    found = {name: ctx.memory.get(name) for name in ctx.memory.keys()}  # noqa: SIM118 (Memory is no dict)
    event = ctx.event.decode()
    command, _, version = event.partition(":")
    if command == "fill":
        for name, value in filled(version).items():
            ctx.memory.set(name, value)
    elif command == "clear":
        for name in list(ctx.memory.keys()):
            ctx.memory.delete(name)
    output = {"key": ctx.entity_key.decode(), "event": event, "found": digest(found), "entries": len(found)}
    return Complete(output=json.dumps(output, sort_keys=True).encode())
