"""ToolLoop: ask the model, run the tools it calls, ask again, until it gives a final answer.

Each round sends the conversation and the offered tools' schemas through ``ctx.call_model``
(so rounds are replay-cached and rate-limited like any model call). For each tool call in
the answer:

* a read-only tool runs inline (``ctx.run_tool``) and its result is appended at once;
* a side-effect tool is staged as an intent (``ctx.act``); once every call of the round is
  handled, the activation suspends with the conversation in its continuation snapshot, and
  each ToolResult resumes it until none is outstanding.

An answer without tool calls ends the loop: ``finish(turn, messages)`` builds the Complete
(default: the answer's text). More than ``max_iterations`` model rounds in one logical run
raise ToolLoopExhausted, which fails the activation like any agent error.

A tool the model names that is not offered gets an error result, so the model can correct
itself; a read-only tool that raises fails the activation (nothing is committed, and the
error record keeps the event).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from keylane.authoring.api import Complete, Suspend
from keylane.authoring.context import ActivationContext
from keylane.errors import KeylaneError
from keylane.llm.types import AssistantTurn, LlmRequest

DEFAULT_MAX_ITERATIONS = 10


class ToolLoopExhausted(KeylaneError):
    """The model still asked for tools after max_iterations rounds."""


class ToolLoopMisuse(KeylaneError):
    """The loop was resumed without its own snapshot, or by something it does not wait for."""


class LoopState(msgspec.Struct, kw_only=True):
    """What survives a suspension: the conversation, the tools offered, the calls still
    waiting, the round count. The tool schemas are kept so that a resume (and a replay of
    it) asks the model with exactly the tools the run started with, even if the registry
    changed in between."""

    messages: list[Any]
    tools_schema: list[Any]
    waiting: dict[str, str]
    """Outstanding side-effect calls: intent id -> the model's tool call id."""
    rounds: int


Finish = Callable[[AssistantTurn, list[Any]], Complete]


def _final_text(turn: AssistantTurn, messages: list[Any]) -> Complete:
    return Complete(turn.text.encode())


@dataclass(frozen=True, kw_only=True)
class ToolLoop:
    """A model-and-tools loop over the tools named in ``tools`` (looked up in the agent's
    tool registry, which also says which of them have side effects)."""

    model: str
    tools: Sequence[str]
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    sampling_params: dict[str, Any] | None = None
    finish: Finish = _final_text
    suspend_timeout_ms: int | None = None

    def __post_init__(self) -> None:
        if self.max_iterations < 1:
            raise ValueError(f"ToolLoop.max_iterations must be >= 1, got {self.max_iterations}")

    async def run(self, ctx: ActivationContext, messages: Sequence[Any] = ()) -> Complete | Suspend:
        """Start the loop on ``messages``, or, on a resume, continue the suspended one."""
        if ctx.is_resume:
            state = self._resumed(ctx)
            if state.waiting:
                return self._suspend(state)
        else:
            schemas = [ctx.tool_spec(name).schema() for name in self.tools]
            state = LoopState(messages=list(messages), tools_schema=schemas, waiting={}, rounds=0)
        offered = {schema["name"] for schema in state.tools_schema}
        while True:
            if state.rounds >= self.max_iterations:
                raise ToolLoopExhausted(
                    f"the model still asked for tools after {self.max_iterations} rounds (max_iterations)"
                )
            state.rounds += 1
            response = await ctx.call_model(
                LlmRequest(
                    model_id=self.model,
                    messages=list(state.messages),  # the request keeps what was asked
                    tools_schema=state.tools_schema,
                    sampling_params=self.sampling_params,
                )
            )
            turn = response.turn()
            state.messages.append(turn.as_message())
            if not turn.tool_calls:
                return self.finish(turn, state.messages)
            for call in turn.tool_calls:
                if call.name not in offered:
                    state.messages.append(_tool_message(call.id, {"error": f"unknown tool {call.name!r}"}))
                elif ctx.tool_spec(call.name).side_effect:
                    intent_id = ctx.act(call.name, msgspec.json.encode(call.arguments).decode())
                    state.waiting[intent_id] = call.id
                else:
                    result = await ctx.run_tool(call.name, call.arguments)
                    state.messages.append(_tool_message(call.id, result))
            if state.waiting:
                return self._suspend(state)

    def _resumed(self, ctx: ActivationContext) -> LoopState:
        try:
            state = msgspec.msgpack.decode(ctx.snapshot, type=LoopState)
        except msgspec.DecodeError:
            raise ToolLoopMisuse(
                "resumed without a ToolLoop snapshot (the suspension was not the loop's)"
            ) from None
        result = ctx.resume_result
        if result is None or result.intent_id not in state.waiting:
            what = "an approval" if result is None else f"a result for {result.intent_id}"
            raise ToolLoopMisuse(f"the tool loop was resumed by {what}, which it does not wait for")
        call_id = state.waiting.pop(result.intent_id)
        content: Any
        if result.status == "OK":
            content = msgspec.json.decode(result.result_json) if result.result_json else None
        else:
            content = {"status": result.status, "error": result.error}
        state.messages.append(_tool_message(call_id, content))
        return state

    def _suspend(self, state: LoopState) -> Suspend:
        return Suspend(snapshot=msgspec.msgpack.encode(state), timeout_ms=self.suspend_timeout_ms)


def _tool_message(call_id: str, result: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": msgspec.json.encode(result).decode()}
