"""Loads user code named on the command line (``module:attribute``), failing in one clear line."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback
from types import ModuleType, TracebackType
from typing import Any

from keylane.authoring.api import AgentConfig, AgentFn
from keylane.errors import ConfigError, UserCodeFailed


def import_module(name: str, what: str) -> ModuleType:
    """Import ``name`` (named by the option ``what``) with the current directory importable,
    as ``python -m`` would have it."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    doing = f"importing {name!r} (for {what})"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not _is_module_or_package_of(exc.name, name):
            raise _failed(doing, exc) from exc
        raise ConfigError(
            f"cannot import module {name!r} (for {what}: {exc}); check the name and run from the project root"
        ) from exc
    except Exception as exc:
        raise _failed(doing, exc) from exc


def _is_module_or_package_of(missing: str, name: str) -> bool:
    """Whether the missing module is ``name`` itself or a package on its path: the name is
    wrong, not something its code imports."""
    return name == missing or name.startswith(missing + ".")


def _failed(doing: str, exc: BaseException) -> UserCodeFailed:
    """A UserCodeFailed for ``exc``, raised by user code while keylane was ``doing`` it: its
    traceback from the user's first frame on (importlib's and keylane's own frames say nothing
    the user can fix)."""
    return UserCodeFailed(
        f"{doing} raised {type(exc).__name__}; the lines above show where",
        "".join(traceback.format_exception(type(exc), exc, _users_frames(exc.__traceback__))),
    )


def _users_frames(tb: TracebackType | None) -> TracebackType | None:
    while tb is not None and (
        tb.tb_frame.f_code.co_filename.startswith("<frozen importlib")
        or tb.tb_frame.f_code.co_filename in (__file__, importlib.__file__)
    ):
        tb = tb.tb_next
    return tb


def load_object(reference: str, what: str) -> Any:
    """The object named by ``module:attribute``."""
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"{what} {reference!r} must look like module:attribute, e.g. examples.echo:agent")
    module = import_module(module_name, f"{what} {reference!r}")
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ConfigError(
            f"module {module_name!r} has no attribute {attribute!r} (from {what} {reference!r})"
        ) from None


def load_agent(agent_ref: str, config_ref: str | None = None) -> tuple[AgentFn, AgentConfig]:
    """The agent function, and its AgentConfig: ``config_ref`` if given, else the agent
    module's ``config`` attribute if it is an AgentConfig, else the defaults."""
    agent = load_object(agent_ref, "--agent")
    check_agent(agent, f"--agent {agent_ref!r}")
    if config_ref is not None:
        config = load_object(config_ref, "--config")
    else:
        config = getattr(sys.modules[agent.__module__], "config", None) or AgentConfig()
    if not isinstance(config, AgentConfig):
        raise ConfigError(f"the agent's config must be an AgentConfig, got {type(config).__name__}")
    return agent, config


AGENT_SHAPE = "an agent is async def agent(ctx) returning Complete(...) or Suspend(...)"


def check_agent(agent: Any, named: str) -> None:
    """Refuse at start what could never run as an agent, rather than dead-letter every event:
    something not callable, a callable that cannot take the one ActivationContext, an async
    generator (a Faust agent's shape). A plain function passes: it may return a coroutine."""
    if not callable(agent):
        raise ConfigError(f"{named} is not a function (it is {type(agent).__name__!r}); {AGENT_SHAPE}")
    if inspect.isasyncgenfunction(agent) or inspect.isgeneratorfunction(agent):
        raise ConfigError(f"{named} is a generator (it yields); {AGENT_SHAPE}")
    try:
        signature = inspect.signature(agent)
    except (TypeError, ValueError):
        return  # a builtin or an extension type: nothing to read
    try:
        signature.bind(None)
    except TypeError:
        bare = signature.replace(
            parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
            return_annotation=signature.empty,
        )
        raise ConfigError(f"{named} takes {bare}, not one argument; {AGENT_SHAPE}") from None
