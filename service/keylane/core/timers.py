"""Durable per-key timers: armed in the key's state, found by a worker-local index, fired
through agent.timers into the key's own lane.

Faust has no per-key timers, so keylane builds them from parts that survive a crash and
move with a partition:

1. the deadline and a token live in the key's KeyState (``timers``), committed with it;
2. each worker keeps an in-memory TimerIndex of the keys in its active partitions, rebuilt
   from the table after every rebalance and updated on every commit;
3. a scan sends a TimerFired command for each due timer to agent.timers, in the key's own
   partition, so the key's lane applies it in order with the key's other inputs;
4. the lane ignores a fire whose token no longer matches (the state moved on) or that comes
   before the deadline; a fire lost in a crash is sent again by the next owner's scan.

Two kinds: ``hitl`` (a suspension's deadline) and ``ttl`` (garbage collection: re-armed by
every input, counted from the deadline while suspended). A TTL collection keeps a tombstone
(the seq counter and applied offsets), so a key that comes back never re-mints old ids.

A fire that was sent but did not move the key's timer on (lost, or applied as early after
a clock step) is sent again RESEND_AFTER_MS later; the lane's token check makes repeats
harmless.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import NamedTuple

from keylane.core.state import ArmedTimer, IntentKind, KeyState
from keylane.wire import TimerFired, TimerKind

RESEND_AFTER_MS = 30_000
HITL: TimerKind = "hitl"
TTL: TimerKind = "ttl"


def timer_token(kind: str, seq: int, deadline_ms: int) -> str:
    """Deterministic, so replaying an input arms the same timer."""
    return f"{kind}:{seq}:{deadline_ms}"


def armed(state: KeyState, *, ttl_ms: int, now_ms: int) -> dict[TimerKind, ArmedTimer]:
    """The timers ``state`` has for what it is now: HITL at the suspension's deadline (if
    suspended), TTL at max(now, deadline) + ttl. The runtime sets them in the same replace as
    the rest of a commit's fields (``KeyRuntime._advance``)."""
    timers: dict[TimerKind, ArmedTimer] = {}
    cont = state.continuation
    ttl_from = now_ms
    if cont is not None:
        timers[HITL] = ArmedTimer(
            deadline_ms=cont.deadline_ms, token=timer_token(HITL, state.seq, cont.deadline_ms)
        )
        ttl_from = max(now_ms, cont.deadline_ms)
    ttl_deadline = ttl_from + ttl_ms
    timers[TTL] = ArmedTimer(deadline_ms=ttl_deadline, token=timer_token(TTL, state.seq, ttl_deadline))
    return timers


COMPACT_FACTOR = 4  # a key has at most two timers, each with a pending and a resend entry
COMPACT_SLACK = 1024


def waiting_for(state: KeyState | None) -> IntentKind | None:
    """What a key waits for: None when it is not suspended, "approval" when at least one of
    the intents its suspension waits for is an approval request, else "tool"."""
    if state is None or state.continuation is None:
        return None
    for intent_id in state.continuation.pending_intent_ids:
        intent = state.pending.get(intent_id)
        if intent is not None and intent.kind == "approval":
            return "approval"
    return "tool"


class TimerIndex:
    """Which keys of this worker's partitions have timers, and when they are due; how many
    of them are suspended, by what they wait for (``waiting``), and how many are paused
    (``paused``: their timers fire only once they are resumed).

    Derived from committed states only, so it can always be rebuilt from the table.
    """

    def __init__(self) -> None:
        self._by_key: dict[bytes, dict[TimerKind, ArmedTimer]] = {}
        self._heap: list[tuple[int, bytes, TimerKind, str]] = []
        self._sent: dict[tuple[bytes, str], int] = {}  # (key, token) -> when it was sent
        self._waiting: dict[bytes, IntentKind] = {}
        self._waiting_counts: dict[IntentKind, int] = {"approval": 0, "tool": 0}
        self._paused: set[bytes] = set()

    def __len__(self) -> int:
        return len(self._by_key)

    def waiting(self, kind: IntentKind) -> int:
        """How many keys are suspended now waiting for ``kind`` (``waiting_for``)."""
        return self._waiting_counts[kind]

    def paused(self) -> int:
        """How many keys are paused now."""
        return len(self._paused)

    def _set_waiting(self, key: bytes, kind: IntentKind | None) -> None:
        old = self._waiting.get(key)
        if old == kind:
            return
        if old is not None:
            self._waiting_counts[old] -= 1
            del self._waiting[key]
        if kind is not None:
            self._waiting_counts[kind] += 1
            self._waiting[key] = kind

    def update(self, key: bytes, state: KeyState | None) -> None:
        """Record a key's committed timers (None: the key was deleted)."""
        if state is not None and state.continuation is not None:
            self._set_waiting(key, waiting_for(state))
        elif key in self._waiting:
            self._set_waiting(key, None)
        if state is not None and state.paused is not None:
            self._paused.add(key)
            timers: dict[TimerKind, ArmedTimer] = {}  # they wait for its resume, which arms them again
        else:
            if self._paused:
                self._paused.discard(key)
            # Committed states are never changed in place: the index keeps the state's own dict.
            timers = state.timers if state is not None else {}
        previous = self._by_key.get(key)
        # Kinds whose old timer was sent: its entry moved to its resend time, which may come
        # after the new timer's deadline.
        was_sent: tuple[TimerKind, ...] = ()
        if previous:
            if self._sent:  # most commits find no timer sent: nothing to forget
                for kind, old in previous.items():
                    if timers.get(kind) != old and self._sent.pop((key, old.token), None) is not None:
                        was_sent += (kind,)
            if not timers:
                del self._by_key[key]
                return
        elif not timers:
            return
        self._by_key[key] = timers
        for kind, timer in timers.items():
            before = previous.get(kind) if previous else None
            # The heap holds an entry at or before every armed timer's deadline, and ``due``
            # puts an armed timer's own entry back when it pops an older one of its key and
            # kind. So a timer that moved later needs no entry of its own: every commit re-arms
            # its key's TTL later, and pushing each would cost every commit a heap entry.
            if before is None or timer.deadline_ms < before.deadline_ms or kind in was_sent:
                heapq.heappush(self._heap, (timer.deadline_ms, key, kind, timer.token))
                # Timers that moved earlier leave their old entries behind until those
                # deadlines: without compaction the heap could grow with commits, not keys.
                if len(self._heap) > COMPACT_FACTOR * len(self._by_key) + COMPACT_SLACK:
                    self._compact()

    def _compact(self) -> None:
        """Drop superseded entries: one entry per armed timer, at its deadline. A timer sent
        already gets its resend entry back from ``due``, which finds when it was sent; building
        the heap from the armed timers costs a pass over the keys, where filtering the heap
        cost a pass over every entry (several per key: the superseded ones of timers that moved
        earlier, and the resend entries of sent ones)."""
        self._heap = [
            (timer.deadline_ms, key, kind, timer.token)
            for key, timers in self._by_key.items()
            for kind, timer in timers.items()
        ]
        heapq.heapify(self._heap)

    def rebuild(self, states: Iterable[tuple[bytes, KeyState]]) -> None:
        """Start over from the committed states of the partitions this worker now owns."""
        self._by_key.clear()
        self._heap.clear()
        self._sent.clear()
        self._waiting.clear()
        self._waiting_counts = {"approval": 0, "tool": 0}
        self._paused.clear()
        for key, state in states:
            self.update(key, state)

    def due(self, now_ms: int) -> list[tuple[bytes, TimerKind, ArmedTimer]]:
        """Timers at or past their deadline, each returned once per token — and again every
        RESEND_AFTER_MS while its key's committed state still holds that token."""
        due = []
        later: list[tuple[int, bytes, TimerKind, str]] = []
        while self._heap and self._heap[0][0] <= now_ms:
            _, key, kind, token = heapq.heappop(self._heap)
            current = self._by_key.get(key, {}).get(kind)
            if current is None:
                continue  # disarmed since it was pushed
            if current.token != token:
                # Re-armed since: the armed timer's own entry, popped in this scan if it is due.
                heapq.heappush(self._heap, (current.deadline_ms, key, kind, current.token))
                continue
            sent_at = self._sent.get((key, token))
            if sent_at is not None and now_ms - sent_at < RESEND_AFTER_MS:
                later.append((sent_at + RESEND_AFTER_MS, key, kind, token))
                continue
            self._sent[(key, token)] = now_ms
            due.append((key, kind, current))
            later.append((now_ms + RESEND_AFTER_MS, key, kind, token))
        for entry in later:
            heapq.heappush(self._heap, entry)
        return due

    def resend(self, key: bytes, kind: TimerKind, timer: ArmedTimer) -> None:
        """Put a fire back (its send failed); the next scan sends it again."""
        self._sent.pop((key, timer.token), None)
        heapq.heappush(self._heap, (timer.deadline_ms, key, kind, timer.token))


class DueTimer(NamedTuple):
    """A timer due now, and the TimerFired command the scan sends into its key's partition."""

    key: bytes
    kind: TimerKind
    timer: ArmedTimer
    fired: TimerFired


def due_timers(index: TimerIndex, now_ms: int) -> list[DueTimer]:
    """The timers ``index`` finds due at ``now_ms`` (``TimerIndex.due``), each with its
    TimerFired command: what the worker's scan sends to agent.timers."""
    return [
        DueTimer(
            key=key,
            kind=kind,
            timer=timer,
            fired=TimerFired(
                entity_key=key.decode(), kind=kind, token=timer.token, deadline_ms=timer.deadline_ms
            ),
        )
        for key, kind, timer in index.due(now_ms)
    ]
