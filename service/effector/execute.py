"""Run one intent's tool and say what happened as a ToolResult status.

* REJECTED — the tool never ran: unknown tool, a read-only tool, arguments that are not a
  JSON object;
* ERROR — it ran and raised, timed out, or returned something JSON cannot carry;
* OK — ``result_json`` is the compact JSON of its return value.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec

from service.tools import ToolRegistry, UnknownTool
from service.wire import ToolIntent, ToolResult, ToolStatus


def result_of(
    intent: ToolIntent, status: ToolStatus, *, result_json: str | None = None, error: str | None = None
) -> ToolResult:
    return ToolResult(
        intent_id=intent.intent_id,
        entity_key=intent.entity_key,
        status=status,
        result_json=result_json,
        error=error,
        completed_at_ms=time.time_ns() // 1_000_000,
    )


async def execute(intent: ToolIntent, registry: ToolRegistry, *, default_timeout_s: float) -> ToolResult:
    """Execute the intent's tool once, bounded by its timeout."""
    try:
        spec = registry.get(intent.tool)
    except UnknownTool as exc:
        return result_of(intent, "REJECTED", error=str(exc))
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
    timeout_s = spec.timeout_s or default_timeout_s
    try:
        value = await asyncio.wait_for(spec.execute(args, in_thread=True), timeout_s)
    except TimeoutError:
        return result_of(intent, "ERROR", error=f"tool {intent.tool!r} timed out after {timeout_s}s")
    except Exception as exc:  # noqa: BLE001 - a failing tool is a result, not an effector crash
        return result_of(intent, "ERROR", error=f"{type(exc).__name__}: {exc}")
    try:
        result_json = msgspec.json.encode(value).decode()
    except (TypeError, msgspec.EncodeError) as exc:
        return result_of(intent, "ERROR", error=f"tool result is not JSON-encodable: {exc}")
    return result_of(intent, "OK", result_json=result_json)
