"""The tool registry: read-only tools run inline, side-effect tools only through intents.

Declare a tool with the decorator::

    @tool("lookup_order")                     # read-only: ctx.run_tool("lookup_order", {...})
    def lookup_order(args): ...

    @tool("refund", side_effect=True)         # only via ctx.act("refund", args_json)
    async def refund(args): ...

A side-effect tool called directly raises SideEffectOutsideIntent: its only path is an
intent that the effector executes once, by intent id.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from service.errors import KeylaneError

ToolFn = Callable[[Any], Any]
F = TypeVar("F", bound=ToolFn)


class SideEffectOutsideIntent(KeylaneError):
    """A side-effect tool was called directly instead of through ``ctx.act``."""


class UnknownTool(KeylaneError):
    """No tool of that name is registered."""


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """A registered tool. ``timeout_s`` bounds one execution (None: the caller's default);
    ``description`` and ``parameters`` (a JSON Schema of its argument object) are what a
    model is shown when the tool is offered to it (ToolLoop)."""

    name: str
    fn: ToolFn
    side_effect: bool
    timeout_s: float | None = None
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object"})

    def schema(self) -> dict[str, Any]:
        """The provider-neutral tool definition: name, description, parameters."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    async def execute(self, args: Any, *, in_thread: bool = False) -> Any:
        """Run the tool on decoded JSON arguments; awaits coroutine tools.

        ``in_thread`` runs a plain function in a worker thread, so a timeout around the call
        is honoured (the effector); inline read-only tools skip the thread hop.
        """
        if in_thread and not inspect.iscoroutinefunction(self.fn):
            return await asyncio.to_thread(self.fn, args)
        result = self.fn(args)
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
    ) -> ToolSpec:
        """Register ``fn`` under ``name``; re-registering a name replaces it. The description
        defaults to the function's docstring."""
        spec = ToolSpec(
            name=name,
            fn=fn,
            side_effect=side_effect,
            timeout_s=timeout_s,
            description=description if description is not None else inspect.cleandoc(fn.__doc__ or ""),
            parameters=parameters if parameters is not None else {"type": "object"},
        )
        self._tools[name] = spec
        return spec

    def get(self, name: str) -> ToolSpec:
        """The tool named ``name``, or UnknownTool."""
        try:
            return self._tools[name]
        except KeyError:
            raise UnknownTool(f"no tool named {name!r} is registered") from None

    def names(self) -> list[str]:
        return sorted(self._tools)


default_registry = ToolRegistry()


def tool(
    name: str,
    *,
    side_effect: bool = False,
    timeout_s: float | None = None,
    registry: ToolRegistry | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
) -> Callable[[F], F]:
    """Register the decorated function as a tool. A side-effect tool's returned wrapper
    raises SideEffectOutsideIntent when called; the registry keeps the real function.
    ``description`` (default: the docstring) and ``parameters`` (a JSON Schema) describe it
    to a model."""

    def decorate(fn: F) -> F:
        (registry or default_registry).register(
            name,
            fn,
            side_effect=side_effect,
            timeout_s=timeout_s,
            description=description,
            parameters=parameters,
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
