"""Loads user code named on the command line (``module:attribute``), failing in one clear line."""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import Any

from keylane.authoring.api import AgentConfig, AgentFn
from keylane.errors import ConfigError


def import_module(name: str) -> ModuleType:
    """Import ``name`` with the current directory importable, as ``python -m`` would have it."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"cannot import module {name!r} ({exc}); check the name and run from the project root"
        ) from exc


def load_object(reference: str, what: str) -> Any:
    """The object named by ``module:attribute``."""
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"{what} {reference!r} must look like module:attribute, e.g. examples.echo:agent")
    module = import_module(module_name)
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
    if not callable(agent):
        raise ConfigError(f"--agent {agent_ref!r} is not a function")
    if config_ref is not None:
        config = load_object(config_ref, "--config")
    else:
        config = getattr(sys.modules[agent.__module__], "config", None) or AgentConfig()
    if not isinstance(config, AgentConfig):
        raise ConfigError(f"the agent's config must be an AgentConfig, got {type(config).__name__}")
    return agent, config
