"""Operator commands on one key (`keylane cancel`, `pause`, `resume`): checked against the
key's stored state, then published on agent.control under the key, where its lane applies
them in order.

agent.control is co-partitioned with the key's other inputs, so a command runs in the key's
lane after everything that reached the key before it, exactly once (its offset is applied
like any input's), and its record stays as the audit log: who (``operator``), what
(``action``), when (``issued_at_ms``) and why (``reason``). Commands are signed with the
signing keys, and the worker checks them as it checks approvals.
"""

from __future__ import annotations

import time
import uuid

from keylane.catalog import CONTROL, Catalog
from keylane.config import Settings
from keylane.errors import KeylaneError
from keylane.inspect import KeyView, inspect_keys
from keylane.kafka.producer import producer
from keylane.wire import KeyAction, KeyCommand, encode


class CommandRefused(KeylaneError):
    """The command would do nothing to the key as it is stored; the message says why, and
    ``--force`` sends it anyway."""


async def send_key_command(
    settings: Settings,
    catalog: Catalog,
    *,
    key: str,
    action: KeyAction,
    operator: str,
    reason: str,
    force: bool,
    logical_check: bool = True,
) -> tuple[KeyCommand, KeyView]:
    """Publish ``action`` on ``key`` (signed when signing keys are configured) and return it
    with the key's stored state it was checked against. Unless ``force``, CommandRefused when
    the command would find nothing to do: a cancel for a key that is not suspended, a pause
    for a paused key, a resume for one that is not paused, or any command for a key that
    never had state while shards ``key#i`` of it do (a sharded agent's inputs never reach
    the logical key: a pause of it would hold nothing); ``logical_check=False`` leaves that
    last check out (``key`` is a shard already)."""
    (view,) = await inspect_keys(settings, catalog, key, logical=False)
    if not force:
        refused = _nothing_to_do(view, action)
        if view.offset is None and logical_check:
            shards = await inspect_keys(settings, catalog, key, logical=True)
            if shards:
                refused = _sharded(key, [shard.key for shard in shards], action)
        if refused is not None:
            raise CommandRefused(f"{refused}; --force sends it anyway")
    command = settings.keyring().sign(
        KeyCommand(
            command_id=str(uuid.uuid4()),
            entity_key=key,
            action=action,
            operator=operator,
            reason=reason,
            issued_at_ms=time.time_ns() // 1_000_000,
        )
    )
    async with producer(settings) as kafka:  # murmur2: the key's partition, its lane
        await kafka.send_and_wait(catalog.name(CONTROL), key=key.encode(), value=encode(command))
    return command, view


async def send_to_shards(
    settings: Settings,
    catalog: Catalog,
    *,
    key: str,
    shards: int,
    action: KeyAction,
    operator: str,
    reason: str,
    force: bool,
) -> list[tuple[str, KeyCommand | CommandRefused]]:
    """``send_key_command`` on each shard ``key#0`` ... ``key#<shards - 1>`` of a logical key,
    in order: per shard, the command sent, or why it was not (a shard with nothing to do is
    skipped, and the others still get theirs)."""
    sent: list[tuple[str, KeyCommand | CommandRefused]] = []
    for index in range(shards):
        shard = f"{key}#{index}"
        try:
            command, _ = await send_key_command(
                settings,
                catalog,
                key=shard,
                action=action,
                operator=operator,
                reason=reason,
                force=force,
                logical_check=False,
            )
        except CommandRefused as refused:
            sent.append((shard, refused))
        else:
            sent.append((shard, command))
    return sent


def _sharded(key: str, shards: list[str], action: KeyAction) -> str:
    named = ", ".join(shards[:4]) + (f" and {len(shards) - 4} more" if len(shards) > 4 else "")
    return (
        f"{key} has no state, but its shards {named} do: the agent is sharded, and its inputs reach "
        f"{key}#i, never {key}; send it to every shard with --shards N (the agent's shards), or "
        f"name one ('keylane {action} {shards[0]} ...')"
    )


def _nothing_to_do(view: KeyView, action: KeyAction) -> str | None:
    """Why ``action`` would change nothing for the key as stored, or None."""
    key = view.key
    if view.unreadable is not None and action != "pause":
        return (
            f"{key}'s stored state does not read ({view.unreadable}); nothing runs for it until that is "
            f"fixed, so a {action} would only be dead-lettered"
        )
    state = view.state
    if action == "cancel" and (state is None or state.continuation is None):
        return (
            f"{key} is not suspended, so there is nothing to cancel ('keylane inspect {key}' shows its "
            "state; a sharded key's suspensions are on its shards KEY#i)"
        )
    if action == "pause" and state is not None and state.paused is not None:
        return f"{key} is paused already, by {state.paused.operator}: {state.paused.reason}"
    if action == "resume" and (state is None or state.paused is None):
        return f"{key} is not paused ('keylane inspect {key}' shows its state)"
    return None
