"""Loading the agent and tools named on the command line: what can never run is refused at
start in one line; user code that raises while it loads shows its own frames, not keylane's."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keylane import ActivationContext, Complete
from keylane.errors import ConfigError, UserCodeFailed
from keylane.loader import check_agent, import_module, load_agent

SHAPE = "an agent is async def agent(ctx) returning Complete(...) or Suspend(...)"


async def takes_nothing() -> Complete:
    return Complete(output=b"")


async def takes_two(ctx: ActivationContext, extra: int) -> Complete:
    return Complete(output=b"")


async def faust_style(stream: Any) -> Any:
    async for event in stream:
        yield event


def sync_generator(ctx: ActivationContext) -> Iterator[int]:
    yield 1


@pytest.mark.parametrize(
    ("agent", "says"),
    [
        (takes_nothing, "--agent 'm:a' takes (), not one argument"),
        (takes_two, "--agent 'm:a' takes (ctx, extra), not one argument"),
        (faust_style, "--agent 'm:a' is a generator (it yields)"),
        (sync_generator, "--agent 'm:a' is a generator (it yields)"),
        (3, "--agent 'm:a' is not a function (it is 'int')"),
    ],
    ids=["no-argument", "two-arguments", "async-generator", "generator", "not-callable"],
)
def test_what_could_never_run_as_an_agent_is_refused_in_one_line(agent: Any, says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        check_agent(agent, "--agent 'm:a'")

    assert str(refused.value) == f"{says}; {SHAPE}"


async def two_arguments(prefix: bytes, ctx: ActivationContext) -> Complete:
    return Complete(output=prefix)


async def with_options(ctx: ActivationContext, *, verbose: bool = False, **extra: Any) -> Complete:
    return Complete(output=b"")


class AgentObject:
    async def __call__(self, ctx: ActivationContext) -> Complete:
        return Complete(output=b"")


def returns_a_coroutine(ctx: ActivationContext) -> Any:
    return with_options(ctx)  # a decorator's wrapper looks like this


@pytest.mark.parametrize(
    "agent",
    [with_options, AgentObject(), functools.partial(two_arguments, b"p"), returns_a_coroutine, print],
    ids=["keyword-options", "object", "partial", "plain-function", "builtin"],
)
def test_every_callable_that_can_take_the_context_passes(agent: Any) -> None:
    check_agent(agent, "--agent 'm:a'")


@pytest.fixture
def user_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path for modules a test writes; they leave sys.modules afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


def test_a_module_that_raises_while_it_loads_shows_only_its_own_frames(user_modules: Path) -> None:
    (user_modules / "helpers_raising.py").write_text("def setup():\n    raise RuntimeError('no API key')\n")
    (user_modules / "agent_raising.py").write_text("import helpers_raising\n\nhelpers_raising.setup()\n")

    with pytest.raises(UserCodeFailed) as failed:
        load_agent("agent_raising:agent")

    assert str(failed.value) == (
        "importing 'agent_raising' (for --agent 'agent_raising:agent') raised RuntimeError; "
        "the lines above show where"
    )
    frames = [line.strip() for line in failed.value.traceback.splitlines() if line.startswith("  File ")]
    assert frames == [
        f'File "{user_modules / "agent_raising.py"}", line 3, in <module>',
        f'File "{user_modules / "helpers_raising.py"}", line 2, in setup',
    ]
    assert failed.value.traceback.endswith("RuntimeError: no API key\n")


def test_a_missing_dependency_is_told_apart_from_a_wrong_name(user_modules: Path) -> None:
    (user_modules / "agent_needing.py").write_text("import keylane_test_not_installed\n")

    with pytest.raises(UserCodeFailed) as failed:
        import_module("agent_needing", "--agent 'agent_needing:agent'")
    assert "ModuleNotFoundError: No module named 'keylane_test_not_installed'" in failed.value.traceback
    assert f'File "{user_modules / "agent_needing.py"}", line 1' in failed.value.traceback

    (user_modules / "present_package").mkdir()
    (user_modules / "present_package" / "__init__.py").write_text("")
    for name in ("absent_module", "present_package.absent"):
        with pytest.raises(ConfigError) as wrong:
            import_module(name, "--agent 'x:y'")
        assert not isinstance(wrong.value, UserCodeFailed)
        assert str(wrong.value) == (
            f"cannot import module {name!r} (for --agent 'x:y': No module named {name!r}); "
            "check the name and run from the project root"
        )


def test_the_cli_prints_the_users_frames_then_one_keylane_line(tmp_path: Path) -> None:
    (tmp_path / "agent_syntax.py").write_text("async def agent(ctx)\n    return None\n")

    failed = subprocess.run(
        [sys.executable, "-m", "keylane.cli", "worker", "--agent", "agent_syntax:agent"],
        cwd=tmp_path,
        env={**os.environ, "KEYLANE_BOOTSTRAP_SERVERS": "127.0.0.1:1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert failed.returncode == 1
    lines = failed.stderr.splitlines()
    assert lines[0] == f'  File "{tmp_path / "agent_syntax.py"}", line 1'
    assert "SyntaxError: expected ':'" in lines
    assert lines[-1] == (
        "keylane: importing 'agent_syntax' (for --agent 'agent_syntax:agent') raised SyntaxError; "
        "the lines above show where"
    )
    assert "keylane/" not in failed.stderr and "importlib" not in failed.stderr
