"""Run one intent's tool and say what happened as a ToolResult status.

* REJECTED — the tool never ran: unknown tool, a read-only tool, arguments that are not a
  JSON object (``check``);
* ERROR — it ran and raised, timed out (its own timeout, or the time left before the
  intent's expiry), or returned something JSON cannot carry;
* OK — ``result_json`` is the compact JSON of its return value.

A tool that takes an ``intent_id`` keyword gets the intent's id, the same on every attempt:
its idempotency key. A timed-out tool's result is ERROR, yet a plain function keeps running
in its worker thread (Python cannot stop a thread): a tool must honour its own timeout, or
be idempotent by intent id.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from keylane.authoring.tools import ToolRegistry, ToolSpec
from keylane.wire import ToolIntent, ToolResult, ToolStatus


def result_of(
    intent: ToolIntent, status: ToolStatus, *, result_json: str | None = None, error: str | None = None
) -> ToolResult:
    """An unsigned ToolResult for ``intent``, completed now."""
    return ToolResult(
        intent_id=intent.intent_id,
        entity_key=intent.entity_key,
        status=status,
        result_json=result_json,
        error=error,
        completed_at_ms=time.time_ns() // 1_000_000,
    )


@dataclass(frozen=True)
class Runnable:
    """An intent that passed ``check``: its tool and decoded arguments."""

    spec: ToolSpec
    args: dict[str, Any]


def check(intent: ToolIntent, registry: ToolRegistry) -> Runnable | ToolResult:
    """The tool and arguments to run, or the REJECTED result saying why nothing can run."""
    spec = registry.find(intent.tool)
    if spec is None:
        return result_of(intent, "REJECTED", error=f"no tool named {intent.tool!r} is registered")
    if not spec.side_effect:
        return result_of(
            intent, "REJECTED", error=f"tool {intent.tool!r} is read-only; intents are for side effects"
        )
    try:
        args: Any = msgspec.json.decode(intent.args_json)
    except msgspec.DecodeError as exc:
        return result_of(intent, "REJECTED", error=f"args_json is not JSON: {exc}")
    if not isinstance(args, dict):
        return result_of(intent, "REJECTED", error="args_json must be a JSON object")
    return Runnable(spec, args)


def timeout_of(spec: ToolSpec | None, default_timeout_s: float) -> float:
    """How long one call of the tool may take."""
    return (spec.timeout_s if spec is not None else None) or default_timeout_s


async def run(
    intent: ToolIntent, runnable: Runnable, *, default_timeout_s: float, budget_s: float | None = None
) -> ToolResult:
    """Call the tool once with the intent id, bounded by its timeout and by ``budget_s`` (the
    time left before the intent's expiry, less a margin), whichever is shorter."""
    tool_timeout_s = timeout_of(runnable.spec, default_timeout_s)
    timeout_s = tool_timeout_s if budget_s is None else min(tool_timeout_s, budget_s)
    try:
        value = await asyncio.wait_for(
            runnable.spec.execute(runnable.args, in_thread=True, intent_id=intent.intent_id), timeout_s
        )
    except TimeoutError:
        if timeout_s < tool_timeout_s:
            error = (
                f"tool {intent.tool!r} did not finish within the {timeout_s:.3f}s left before the "
                "intent's expiry; it may still take effect"
            )
            return result_of(intent, "ERROR", error=error)
        return result_of(intent, "ERROR", error=f"tool {intent.tool!r} timed out after {timeout_s}s")
    except Exception as exc:  # noqa: BLE001 - a failing tool is a result, not an effector crash
        return result_of(intent, "ERROR", error=f"{type(exc).__name__}: {exc}")
    return ok_result(intent, value, what="tool result")


def ok_result(intent: ToolIntent, value: Any, *, what: str) -> ToolResult:
    """OK with ``value`` as compact JSON, or ERROR when JSON cannot carry it."""
    try:
        result_json = msgspec.json.encode(value).decode()
    except (TypeError, msgspec.EncodeError) as exc:
        return result_of(intent, "ERROR", error=f"{what} is not JSON-encodable: {exc}")
    return result_of(intent, "OK", result_json=result_json)


async def execute(intent: ToolIntent, registry: ToolRegistry, *, default_timeout_s: float) -> ToolResult:
    """``check`` then ``run``: execute the intent's tool once, bounded by its timeout."""
    runnable = check(intent, registry)
    if isinstance(runnable, ToolResult):
        return runnable
    return await run(intent, runnable, default_timeout_s=default_timeout_s)
