"""The Faust internals keylane patches are checked against the installed faust-streaming."""

from __future__ import annotations

import tomllib
from pathlib import Path

import faust
import pytest

from keylane.errors import ConfigError
from keylane.kafka import patches

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def test_every_patched_attribute_exists_on_the_installed_faust() -> None:
    patches.check_patchable(patches.PATCHED)  # what importing the module already did


def test_a_missing_attribute_fails_naming_the_installed_version_and_the_pinned_range() -> None:
    class Consumer:
        perform_seek = None

    with pytest.raises(ConfigError) as raised:
        patches.check_patchable([(Consumer, "perform_seek"), (Consumer, "_drain_messages")])

    message = str(raised.value)
    assert "Consumer._drain_messages" in message and "perform_seek" not in message
    assert faust.__version__ in message and patches.FAUST_PIN in message


def test_the_pinned_range_is_the_one_pyproject_pins() -> None:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    assert f"faust-streaming{patches.FAUST_PIN}" in dependencies
