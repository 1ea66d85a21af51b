"""Poison state: the keys whose stored state this worker cannot read, held apart from the rest.

A blob from a newer keylane (a rollback) or one that does not decode must not stop anything
but its own key. Such a key is *quarantined*: every input for it becomes a ``poison_state``
dead letter at once (no retries: retrying cannot make the blob readable), with its raw bytes
and origin, so an operator can re-drive them once the cause is fixed; every other key of the
partition keeps flowing. The quarantine lists the keys of this worker's partitions found
unreadable, by a lane reading the key or by the timer-index rebuild after a rebalance; it is
exported as ``keylane_quarantined_keys`` and each key is logged once when it enters. A key
leaves as soon as its state reads again (the newer keylane deployed, or its state removed).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from keylane.core.state import KeyState, UnreadableState, decode_state

log = logging.getLogger(__name__)


class Quarantine:
    """The quarantined keys of this worker, each with why its state does not read."""

    def __init__(self) -> None:
        self._why: dict[bytes, str] = {}

    def __len__(self) -> int:
        return len(self._why)

    def __contains__(self, key: bytes) -> bool:
        return key in self._why

    def enter(self, key: bytes, why: str) -> None:
        """Quarantine ``key`` (logged the first time, not for every input after)."""
        if key not in self._why:
            log.error(
                "key %r is quarantined: its state does not read (%s); its inputs go to agent.errors "
                "as poison_state until it does",
                key,
                why,
            )
        self._why[key] = why

    def release(self, key: bytes) -> None:
        """``key``'s state reads again."""
        if self._why.pop(key, None) is not None:
            log.warning("key %r left quarantine: its state reads again", key)

    def readable(self, blobs: Iterable[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, KeyState]]:
        """Start over from ``blobs`` (the committed states of this worker's partitions): yield
        each one that decodes, quarantine each key whose blob does not."""
        self._why.clear()
        for key, blob in blobs:
            try:
                state = decode_state(blob)
            except UnreadableState as exc:
                self.enter(key, str(exc))
                continue
            yield key, state
