"""A worker's Faust app calls a sensor per record only when the sensor acts on records
(service/keylane/kafka/sensors.py); commit hooks still reach every sensor. Runs on a real
Faust app built by build_app, with real Sensor subclasses."""

from __future__ import annotations

from typing import Any

import faust
import pytest
from faust.sensors import Monitor
from faust.types import TP

from keylane.catalog import load_catalog
from keylane.config import Settings
from keylane.kafka.app import build_app
from keylane.kafka.consumer_lag import CommitSensor
from keylane.kafka.sensors import PER_RECORD_HOOKS, CommitMonitor, HookedSensors


class TableWatcher(faust.Sensor):
    """Acts on table writes and on sends, nothing else."""

    def __init__(self) -> None:
        super().__init__()
        self.sets: list[tuple[Any, Any]] = []
        self.confirmed: list[Any] = []

    def on_table_set(self, table: Any, key: Any, value: Any) -> None:
        self.sets.append((key, value))

    def on_send_initiated(self, producer: Any, topic: str, message: Any, keysize: int, valsize: int) -> Any:
        return f"sent to {topic}"

    def on_send_completed(self, producer: Any, state: Any, metadata: Any) -> None:
        self.confirmed.append((state, metadata))


class CommitCounter(faust.Sensor):
    def __init__(self) -> None:
        super().__init__()
        self.commits = 0

    def on_commit_completed(self, consumer: Any, state: Any) -> None:
        self.commits += 1


@pytest.fixture
def app(tmp_path: Any) -> faust.App:
    return build_app(Settings.from_env({}, data_dir=tmp_path, app_id="sensors"), load_catalog(prefix="s."))


def started_sensors(app: faust.App) -> HookedSensors:
    """The delegate as a started worker has it: Faust adds its Monitor at start-up
    (App.on_init_dependencies, which also builds the consumer and producer, so not called
    here), keylane's offset guard adds its commit sensor."""
    app.sensors.add(app.monitor)
    app.sensors.add(CommitSensor(lambda consumer: None))
    assert isinstance(app.sensors, HookedSensors)
    return app.sensors


async def test_a_worker_app_calls_no_sensor_per_record(app: faust.App) -> None:
    sensors = started_sensors(app)
    assert isinstance(app.monitor, CommitMonitor)
    assert app.monitor in set(sensors)
    assert [hook for hook in PER_RECORD_HOOKS if sensors.listeners(hook)] == []


async def test_a_sensor_that_acts_on_records_gets_each_call(app: faust.App) -> None:
    sensors = started_sensors(app)
    watcher = TableWatcher()
    sensors.add(watcher)
    assert sensors.listeners("on_table_set") == (watcher,)
    assert sensors.listeners("on_table_get") == ()
    sensors.on_table_set(object(), b"k", b"v")
    sensors.on_table_get(object(), b"k")
    state = sensors.on_send_initiated(None, "out", None, 1, 2)
    sensors.on_send_completed(None, state, "metadata")
    assert watcher.sets == [(b"k", b"v")]
    assert watcher.confirmed == [("sent to out", "metadata")]
    sensors.remove(watcher)
    assert sensors.listeners("on_table_set") == ()


async def test_commit_hooks_still_reach_every_sensor(app: faust.App) -> None:
    sensors = started_sensors(app)
    counter = CommitCounter()
    sensors.add(counter)
    state = sensors.on_commit_initiated(consumer=None)
    sensors.on_commit_completed(None, state)
    assert counter.commits == 1
    # Faust's consumer reports commits to its Monitor directly, not through the delegate.
    app.monitor.on_tp_commit({TP("s.agent.events", 0): 41})
    assert app.monitor.tp_committed_offsets == {TP("s.agent.events", 0): 41}


async def test_the_commit_monitor_keeps_no_per_record_statistics() -> None:
    monitor = CommitMonitor()
    monitor.on_message_in(TP("t", 0), 0, None)
    monitor.on_table_set(object(), b"k", b"v")
    assert monitor.messages_received_total == 0
    assert isinstance(monitor, Monitor)
