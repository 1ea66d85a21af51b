"""The tool registry: read-only tools run inline, side-effect tools only through intents.

Declare a tool with the decorator::

    @tool("lookup_order")                     # read-only: ctx.run_tool("lookup_order", {...})
    def lookup_order(args): ...

    @tool("refund", side_effect=True)         # only via ctx.act("refund", args_json)
    async def refund(args, *, intent_id): ...  # intent_id: the idempotency key (optional)

A side-effect tool called directly raises SideEffectOutsideIntent: its only path is an
intent that the effector executes once, by intent id.

A side-effect tool whose function has a parameter named ``intent_id`` is called with the
intent's id as that keyword, the same on every attempt: pass it to the downstream service as
its idempotency key. Plain ``fn(args)`` tools are called with the arguments alone.

An effector killed after a tool took effect but before it recorded the outcome leaves the
intent *in doubt* (docs/effector.md). ``reconcile=fn`` asks the tool's own system what
happened: ``fn(intent_id)`` (sync or async) returns the earlier result (any JSON value: it
happened, answered as OK) or None (it did not happen: it runs now). Without a hook the
``in_doubt`` policy decides: ``"error"`` (the default: answer ERROR "in doubt: ...", never
run it again; a lost effect is recoverable, a doubled one often is not) or ``"rerun"`` (run
it again: for tools that are idempotent by ``intent_id``)::

    @tool("refund", side_effect=True, reconcile=lambda intent_id: payments.find(intent_id))
    def refund(args, *, intent_id): ...
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, TypeVar, cast

from keylane.errors import KeylaneError

ToolFn = Callable[..., Any]
"""``fn(args)`` or ``fn(args, *, intent_id)``; may return an awaitable."""
ReconcileFn = Callable[[str], Any]
"""``reconcile(intent_id)`` -> the earlier result (JSON-able), or None: it never happened."""
InDoubtPolicy = Literal["rerun", "error"]
IN_DOUBT_POLICIES: tuple[InDoubtPolicy, ...] = ("rerun", "error")
F = TypeVar("F", bound=ToolFn)


class SideEffectOutsideIntent(KeylaneError):
    """A side-effect tool was called directly instead of through ``ctx.act``."""


class UnknownTool(KeylaneError):
    """No tool of that name is registered."""


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """A registered tool. ``timeout_s`` bounds one execution (None: the caller's default);
    ``description`` and ``parameters`` (a JSON Schema of its argument object) are what a
    model is shown when the tool is offered to it (ToolLoop). ``reconcile`` and
    ``in_doubt`` say how the effector settles an intent left in doubt (module docstring)."""

    name: str
    fn: ToolFn
    side_effect: bool
    timeout_s: float | None = None
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    reconcile: ReconcileFn | None = None
    in_doubt: InDoubtPolicy = "error"

    def __post_init__(self) -> None:
        if self.in_doubt not in IN_DOUBT_POLICIES:
            raise ValueError(f"tool {self.name!r}: in_doubt={self.in_doubt!r} must be 'rerun' or 'error'")
        if self.reconcile is not None and not self.side_effect:
            raise ValueError(f"tool {self.name!r}: reconcile= is for side-effect tools only")

    @cached_property
    def takes_intent_id(self) -> bool:
        """Whether ``fn`` has a parameter ``intent_id`` it can take as a keyword."""
        try:
            parameter = inspect.signature(self.fn).parameters.get("intent_id")
        except (TypeError, ValueError):  # a builtin or C callable without a signature
            return False
        return parameter is not None and parameter.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        )

    def schema(self) -> dict[str, Any]:
        """The provider-neutral tool definition: name, description, parameters."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    async def execute(self, args: Any, *, in_thread: bool = False, intent_id: str | None = None) -> Any:
        """Run the tool on decoded JSON arguments; awaits coroutine tools.

        ``in_thread`` runs a plain function in a worker thread, so a timeout around the call
        is honoured (the effector); inline read-only tools skip the thread hop. ``intent_id``
        is passed as a keyword when the function takes one (``takes_intent_id``).
        """
        kwargs = {"intent_id": intent_id} if intent_id is not None and self.takes_intent_id else {}
        return await _call(self.fn, args, in_thread=in_thread, **kwargs)

    async def reconciled(self, intent_id: str) -> Any:
        """``reconcile(intent_id)``: a sync hook runs in a worker thread (it usually asks a
        remote system), an async one is awaited. Raises ValueError without a hook."""
        if self.reconcile is None:
            raise ValueError(f"tool {self.name!r} has no reconcile hook")
        return await _call(self.reconcile, intent_id, in_thread=True)


async def _call(fn: Callable[..., Any], arg: Any, *, in_thread: bool, **kwargs: Any) -> Any:
    if in_thread and not inspect.iscoroutinefunction(fn):
        return await asyncio.to_thread(fn, arg, **kwargs)
    result = fn(arg, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


class ToolRegistry:
    """Tools by name. One process-wide default registry backs the ``tool`` decorator."""

    def __init__(self) -> None:
        self._tools: dict[str, ToolSpec] = {}

    def register(
        self,
        name: str,
        fn: ToolFn,
        *,
        side_effect: bool = False,
        timeout_s: float | None = None,
        description: str | None = None,
        parameters: dict[str, Any] | None = None,
        reconcile: ReconcileFn | None = None,
        in_doubt: InDoubtPolicy = "error",
    ) -> ToolSpec:
        """Register ``fn`` under ``name``; re-registering a name replaces it. The description
        defaults to the function's docstring. ValueError for an in_doubt policy other than
        "rerun" or "error", or a reconcile hook on a read-only tool."""
        spec = ToolSpec(
            name=name,
            fn=fn,
            side_effect=side_effect,
            timeout_s=timeout_s,
            description=description if description is not None else inspect.cleandoc(fn.__doc__ or ""),
            parameters=parameters if parameters is not None else {"type": "object"},
            reconcile=reconcile,
            in_doubt=in_doubt,
        )
        self._tools[name] = spec
        return spec

    def get(self, name: str) -> ToolSpec:
        """The tool named ``name``, or UnknownTool."""
        try:
            return self._tools[name]
        except KeyError:
            raise UnknownTool(f"no tool named {name!r} is registered") from None

    def find(self, name: str) -> ToolSpec | None:
        """The tool named ``name``, or None."""
        return self._tools.get(name)

    def names(self) -> list[str]:
        """The registered tool names, sorted."""
        return sorted(self._tools)

    def specs(self) -> list[ToolSpec]:
        """Every registered tool, by name."""
        return [self._tools[name] for name in self.names()]


default_registry = ToolRegistry()


def tool(
    name: str,
    *,
    side_effect: bool = False,
    timeout_s: float | None = None,
    registry: ToolRegistry | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
    reconcile: ReconcileFn | None = None,
    in_doubt: InDoubtPolicy = "error",
) -> Callable[[F], F]:
    """Register the decorated function as a tool. A side-effect tool's returned wrapper
    raises SideEffectOutsideIntent when called; the registry keeps the real function.
    ``description`` (default: the docstring) and ``parameters`` (a JSON Schema) describe it
    to a model; ``reconcile`` and ``in_doubt`` settle an intent left in doubt (module
    docstring; default: answer ERROR, never run twice)."""

    def decorate(fn: F) -> F:
        (registry or default_registry).register(
            name,
            fn,
            side_effect=side_effect,
            timeout_s=timeout_s,
            description=description,
            parameters=parameters,
            reconcile=reconcile,
            in_doubt=in_doubt,
        )
        if not side_effect:
            return fn

        def guarded(*args: Any, **kwargs: Any) -> Any:
            raise SideEffectOutsideIntent(
                f"tool {name!r} has side effects: stage it with ctx.act({name!r}, args_json) so the "
                "effector runs it once"
            )

        guarded.__name__ = getattr(fn, "__name__", name)
        guarded.__doc__ = fn.__doc__
        return cast(F, guarded)

    return decorate
