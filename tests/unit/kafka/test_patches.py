"""The Faust internals keylane patches are checked against the installed faust-streaming."""

from __future__ import annotations

import asyncio
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


async def test_a_publish_through_a_running_producer_does_not_wait_for_the_event_loop() -> None:
    """mode's stampede wrapper around Faust's producer start awaited three turns of the event
    loop on every send; with the producer running, the patched lookup returns it at once."""
    patches.publish_without_stampede()
    app = faust.App("publish-without-stampede", broker="kafka://127.0.0.1:1")
    producer = app.producer
    producer._started.set()  # what Faust's start sets; no broker needed to look the producer up
    topic = app.topic("t")
    turns: list[int] = []
    asyncio.get_running_loop().call_soon(turns.append, 1)

    assert await topic._get_producer() is producer
    assert turns == [], "the lookup waited for the event loop"
