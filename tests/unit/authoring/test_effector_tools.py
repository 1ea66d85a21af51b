"""What a tool declares for the effector: the intent id keyword, reconcile hooks, in_doubt."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from keylane.authoring.tools import ToolRegistry, tool


def test_only_a_function_with_an_intent_id_parameter_gets_the_intent_id() -> None:
    registry = ToolRegistry()

    def keyword_only(args: Any, *, intent_id: str) -> None: ...
    def positional_or_keyword(args: Any, intent_id: str) -> None: ...
    def plain(args: Any) -> None: ...
    def catch_all(args: Any, **kwargs: Any) -> None: ...

    takes = {
        fn.__name__: registry.register(fn.__name__, fn, side_effect=True).takes_intent_id
        for fn in (keyword_only, positional_or_keyword, plain, catch_all)
    }
    takes["builtin"] = registry.register("builtin", print, side_effect=True).takes_intent_id
    takes["partial"] = registry.register(
        "partial", functools.partial(keyword_only), side_effect=True
    ).takes_intent_id

    assert takes == {
        "keyword_only": True,
        "positional_or_keyword": True,
        "plain": False,
        "catch_all": False,  # a wrapper's **kwargs may not pass it on: only a named parameter
        "builtin": False,
        "partial": True,
    }


async def test_execute_passes_the_intent_id_only_to_tools_that_take_it() -> None:
    registry = ToolRegistry()
    keyed = registry.register("keyed", lambda args, *, intent_id: (args, intent_id), side_effect=True)
    plain = registry.register("plain", lambda args: args, side_effect=True)

    assert await keyed.execute({"a": 1}, intent_id="i-1") == ({"a": 1}, "i-1")
    assert await plain.execute({"a": 1}, intent_id="i-1") == {"a": 1}
    assert await keyed.execute({"a": 1}, in_thread=True, intent_id="i-2") == ({"a": 1}, "i-2")


def test_the_decorator_declares_reconcile_and_in_doubt_and_the_default_is_error() -> None:
    registry = ToolRegistry()

    def find(intent_id: str) -> Any:
        return None

    @tool("refund", side_effect=True, reconcile=find, registry=registry)
    def refund(args: Any, *, intent_id: str) -> None: ...

    @tool("email", side_effect=True, in_doubt="rerun", registry=registry)
    def email(args: Any) -> None: ...

    @tool("charge", side_effect=True, registry=registry)
    def charge(args: Any) -> None: ...

    specs = {name: registry.get(name) for name in ("refund", "email", "charge")}
    assert {n: (s.reconcile, s.in_doubt) for n, s in specs.items()} == {
        "refund": (find, "error"),
        "email": (None, "rerun"),
        "charge": (None, "error"),
    }


async def test_a_sync_or_async_reconcile_hook_is_called_with_the_intent_id() -> None:
    registry = ToolRegistry()

    async def found(intent_id: str) -> Any:
        return {"ref": intent_id}

    sync = registry.register("a", lambda args: None, side_effect=True, reconcile=lambda i: [i])
    asynchronous = registry.register("b", lambda args: None, side_effect=True, reconcile=found)

    assert await sync.reconciled("i-1") == ["i-1"]
    assert await asynchronous.reconciled("i-2") == {"ref": "i-2"}


def test_a_bad_in_doubt_policy_or_a_read_only_reconcile_is_refused_at_registration() -> None:
    registry = ToolRegistry()

    with pytest.raises(ValueError, match="in_doubt='retry' must be 'rerun' or 'error'"):
        registry.register("refund", lambda args: None, side_effect=True, in_doubt="retry")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reconcile= is for side-effect tools only"):
        registry.register("lookup", lambda args: None, reconcile=lambda intent_id: None)
    assert registry.names() == []
