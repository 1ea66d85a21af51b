"""Faust's sensor calls made once per record reach only the sensors that act on them.

Faust calls its sensor delegate several times per record: a message in and out, a stream
event in and out, a table read and write, a send started and confirmed. Its delegate calls
every sensor for each, and builds a dict of their states for some. A keylane worker's sensors
act on commits, not on records: keylane's commit sensors (consumer_lag, restore_start) and
Faust's Monitor, whose per-record statistics only Faust's web server shows, and keylane turns
that off (build_app); keylane's own per-record figures are its Prometheus metrics.

* ``HookedSensors`` replaces the app's delegate. Each per-record hook calls only the sensors
  whose class overrides that hook, so a sensor still gets every call it acts on.
* ``CommitMonitor`` is Faust's Monitor without the per-record statistics. Faust's consumer
  still calls it directly for end offsets and commits.
"""

from __future__ import annotations

from typing import Any

import faust
from faust.sensors import Monitor, SensorDelegate
from faust.sensors.base import Sensor

PER_RECORD_HOOKS = (
    "on_message_in",
    "on_stream_event_in",
    "on_stream_event_out",
    "on_message_out",
    "on_table_get",
    "on_table_set",
    "on_table_del",
    "on_send_initiated",
    "on_send_completed",
    "on_send_error",
)


def acts_on(sensor: Any, hook: str) -> bool:
    """Whether ``sensor``'s class does something in ``hook`` (Sensor's own is a no-op)."""
    return getattr(type(sensor), hook, None) is not getattr(Sensor, hook)


class HookedSensors(SensorDelegate):
    """Faust's SensorDelegate whose per-record hooks call only the sensors that override them."""

    def __init__(self, app: faust.App) -> None:
        super().__init__(app)
        self._listeners: dict[str, tuple[Any, ...]] = {hook: () for hook in PER_RECORD_HOOKS}

    def add(self, sensor: Any) -> None:
        super().add(sensor)
        self._index()

    def remove(self, sensor: Any) -> None:
        super().remove(sensor)
        self._index()

    def listeners(self, hook: str) -> tuple[Any, ...]:
        """The sensors ``hook`` reaches."""
        return self._listeners[hook]

    def _index(self) -> None:
        sensors = self._sensors
        self._listeners = {hook: tuple(s for s in sensors if acts_on(s, hook)) for hook in PER_RECORD_HOOKS}

    def on_message_in(self, tp: Any, offset: int, message: Any) -> None:
        for sensor in self._listeners["on_message_in"]:
            sensor.on_message_in(tp, offset, message)

    def on_stream_event_in(self, tp: Any, offset: int, stream: Any, event: Any) -> dict[Any, Any] | None:
        return {
            sensor: sensor.on_stream_event_in(tp, offset, stream, event)
            for sensor in self._listeners["on_stream_event_in"]
        }

    def on_stream_event_out(
        self, tp: Any, offset: int, stream: Any, event: Any, state: dict[Any, Any] | None = None
    ) -> None:
        states = state or {}
        for sensor in self._listeners["on_stream_event_out"]:
            sensor.on_stream_event_out(tp, offset, stream, event, states.get(sensor))

    def on_message_out(self, tp: Any, offset: int, message: Any) -> None:
        for sensor in self._listeners["on_message_out"]:
            sensor.on_message_out(tp, offset, message)

    def on_table_get(self, table: Any, key: Any) -> None:
        for sensor in self._listeners["on_table_get"]:
            sensor.on_table_get(table, key)

    def on_table_set(self, table: Any, key: Any, value: Any) -> None:
        for sensor in self._listeners["on_table_set"]:
            sensor.on_table_set(table, key, value)

    def on_table_del(self, table: Any, key: Any) -> None:
        for sensor in self._listeners["on_table_del"]:
            sensor.on_table_del(table, key)

    def on_send_initiated(self, producer: Any, topic: str, message: Any, keysize: int, valsize: int) -> Any:
        return {
            sensor: sensor.on_send_initiated(producer, topic, message, keysize, valsize)
            for sensor in self._listeners["on_send_initiated"]
        }

    def on_send_completed(self, producer: Any, state: Any, metadata: Any) -> None:
        # .get: a sensor added between a send and its confirmation has no state for it
        for sensor in self._listeners["on_send_completed"]:
            sensor.on_send_completed(producer, state.get(sensor), metadata)

    def on_send_error(self, producer: Any, exc: BaseException, state: Any) -> None:
        for sensor in self._listeners["on_send_error"]:
            sensor.on_send_error(producer, exc, state.get(sensor))


class CommitMonitor(Monitor):
    """Faust's Monitor, minus its per-record statistics (see the module docstring)."""

    on_message_in = Sensor.on_message_in
    on_stream_event_in = Sensor.on_stream_event_in
    on_stream_event_out = Sensor.on_stream_event_out
    on_message_out = Sensor.on_message_out
    on_table_get = Sensor.on_table_get
    on_table_set = Sensor.on_table_set
    on_table_del = Sensor.on_table_del
    on_send_initiated = Sensor.on_send_initiated
    on_send_completed = Sensor.on_send_completed
    on_send_error = Sensor.on_send_error


def hook_sensors(app: faust.App) -> None:
    """Give ``app`` a HookedSensors delegate, keeping the sensors it has."""
    hooked = HookedSensors(app)
    for sensor in list(app.sensors):
        hooked.add(sensor)
    app.sensors = hooked
