"""Durable per-key timers, broker-free: which timers a committed state arms, the fires that
change nothing (stale, duplicate, early), and the worker's TimerIndex."""

from __future__ import annotations

from msgspec.structs import replace

from keylane.core.state import ArmedTimer, Continuation, IntentKind, KeyState, PendingIntent
from keylane.core.timers import HITL, RESEND_AFTER_MS, TTL, TimerIndex, armed, timer_token
from keylane.testing import ManualClock
from tests.unit.hitl_support import (
    KEY,
    MINUTE,
    TIMEOUT_OUTPUT,
    TTL_MS,
    WAIT_MS,
    AsksForApproval,
    approval,
    asked,
    assert_changed_nothing,
    deadline_of,
    harness_of,
    send_fire,
)


def arm(state: KeyState, *, ttl_ms: int, now_ms: int) -> KeyState:
    """``state`` with the timers ``armed`` gives it, as the runtime commits it."""
    return replace(state, timers=armed(state, ttl_ms=ttl_ms, now_ms=now_ms))


# 1. Which timers a committed state arms -------------------------------------------------------


async def test_a_suspension_arms_hitl_at_its_deadline_and_ttl_counted_from_the_deadline() -> None:
    clock = ManualClock()
    asked_at = clock.now_ms
    harness, _ = await asked(clock)

    state = harness.state(KEY)
    assert state.continuation is not None
    deadline = asked_at + WAIT_MS
    assert state.continuation.deadline_ms == deadline
    assert state.timers == {
        HITL: ArmedTimer(deadline_ms=deadline, token=timer_token(HITL, 1, deadline)),
        TTL: ArmedTimer(deadline_ms=deadline + TTL_MS, token=timer_token(TTL, 1, deadline + TTL_MS)),
    }


async def test_a_completed_activation_leaves_only_a_ttl_timer_at_now_plus_ttl() -> None:
    clock = ManualClock()
    harness = harness_of(AsksForApproval(), clock)

    await harness.send_event(KEY, "hello")

    assert harness.outputs() == [(KEY, b"ran hello")]
    expected = clock.now_ms + TTL_MS
    assert harness.state(KEY).timers == {
        TTL: ArmedTimer(deadline_ms=expected, token=timer_token(TTL, 1, expected))
    }


async def test_a_resume_that_completes_disarms_hitl_and_counts_ttl_from_the_resume() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    [request] = harness.approval_requests()

    clock.advance(3 * MINUTE)
    await harness.send_approval(approval(request.intent_id))

    assert harness.outputs() == [(KEY, b"approved after ask")]
    assert set(harness.state(KEY).timers) == {TTL}
    assert harness.state(KEY).timers[TTL].deadline_ms == clock.now_ms + TTL_MS


async def test_every_committed_input_rearms_ttl_with_a_new_token() -> None:
    clock = ManualClock()
    harness = harness_of(AsksForApproval(), clock)
    armed: list[ArmedTimer] = []

    for _ in range(3):
        await harness.send_event(KEY, "hello")
        armed.append(harness.state(KEY).timers[TTL])
        clock.advance(5 * MINUTE)

    assert [t.deadline_ms for t in armed] == [
        armed[0].deadline_ms,
        armed[0].deadline_ms + 5 * MINUTE,
        armed[0].deadline_ms + 10 * MINUTE,
    ]
    assert len({t.token for t in armed}) == 3


async def test_an_orphaned_input_commits_nothing_and_does_not_rearm_ttl() -> None:
    clock = ManualClock()
    harness = harness_of(AsksForApproval(), clock)
    await harness.send_event(KEY, "hello")
    before = harness.store[KEY]

    clock.advance(5 * MINUTE)
    await harness.send_approval(approval("nobody-asked"))

    assert harness.store[KEY] == before
    assert [e.reason for e in harness.errors()] == ["orphaned_result"]


async def test_an_event_queued_while_suspended_keeps_ttl_at_deadline_plus_ttl() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    deadline = deadline_of(harness)
    timers_before = harness.state(KEY).timers

    clock.advance(WAIT_MS // 2)
    await harness.send_event(KEY, "meanwhile")

    assert harness.state(KEY).timers == timers_before
    assert harness.state(KEY).timers[TTL].deadline_ms == deadline + TTL_MS


async def test_an_event_queued_after_the_deadline_counts_ttl_from_now_and_keeps_the_hitl_timer() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    hitl_before = harness.state(KEY).timers[HITL]

    clock.advance(WAIT_MS + 7 * MINUTE)  # past the deadline; the HITL fire has not arrived yet
    await harness.send_event(KEY, "late")

    timers = harness.state(KEY).timers
    assert timers[HITL] == hitl_before
    assert timers[TTL].deadline_ms == clock.now_ms + TTL_MS


def test_arm_counts_ttl_from_the_later_of_now_and_the_deadline() -> None:
    idle = KeyState(seq=4)
    state = KeyState(
        seq=4, continuation=Continuation(seq=3, step_index=1, pending_intent_ids=["i"], deadline_ms=500)
    )
    assert arm(idle, ttl_ms=100, now_ms=1_000).timers == {
        TTL: ArmedTimer(deadline_ms=1_100, token="ttl:4:1100")
    }
    assert arm(state, ttl_ms=100, now_ms=1_000).timers == {
        HITL: ArmedTimer(deadline_ms=500, token="hitl:4:500"),
        TTL: ArmedTimer(deadline_ms=1_100, token="ttl:4:1100"),
    }
    assert arm(state, ttl_ms=100, now_ms=200).timers[TTL].deadline_ms == 600


# 2. Stale, duplicate and early fires change nothing -------------------------------------------


async def test_a_fire_with_a_wrong_token_changes_nothing() -> None:
    clock = ManualClock()
    harness, approver = await asked(clock)
    deadline = deadline_of(harness)
    clock.advance(WAIT_MS)
    before, published = harness.store[KEY], len(harness.published)

    decision = await send_fire(harness, HITL, timer_token(HITL, 0, deadline), deadline)

    assert_changed_nothing(harness, decision, before, published)
    assert approver.decisions == []


async def test_a_fire_of_the_right_token_under_the_other_kind_changes_nothing() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    hitl = harness.state(KEY).timers[HITL]
    clock.advance(WAIT_MS + TTL_MS)
    before, published = harness.store[KEY], len(harness.published)

    decision = await send_fire(harness, TTL, hitl.token, hitl.deadline_ms)

    assert_changed_nothing(harness, decision, before, published)


async def test_a_second_fire_of_an_applied_token_changes_nothing() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    hitl = harness.state(KEY).timers[HITL]
    clock.advance(WAIT_MS)
    await harness.fire_due_timers()
    assert harness.outputs() == [(KEY, TIMEOUT_OUTPUT)]
    before, published = harness.store[KEY], len(harness.published)

    decision = await send_fire(harness, HITL, hitl.token, hitl.deadline_ms)

    assert_changed_nothing(harness, decision, before, published)
    assert harness.outputs() == [(KEY, TIMEOUT_OUTPUT)]


async def test_a_fire_before_the_deadline_changes_nothing_and_the_timer_still_fires_when_due() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    hitl = harness.state(KEY).timers[HITL]
    clock.advance(WAIT_MS - 1)
    before, published = harness.store[KEY], len(harness.published)

    decision = await send_fire(harness, HITL, hitl.token, hitl.deadline_ms)

    assert_changed_nothing(harness, decision, before, published)
    clock.advance(1)
    await harness.fire_due_timers()
    assert harness.outputs() == [(KEY, TIMEOUT_OUTPUT)]


async def test_a_fire_superseded_by_a_resume_changes_nothing() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    hitl = harness.state(KEY).timers[HITL]
    [request] = harness.approval_requests()
    await harness.send_approval(approval(request.intent_id))
    clock.advance(WAIT_MS)
    before, published = harness.store[KEY], len(harness.published)

    decision = await send_fire(harness, HITL, hitl.token, hitl.deadline_ms)

    assert_changed_nothing(harness, decision, before, published)
    assert harness.outputs() == [(KEY, b"approved after ask")]


async def test_the_scan_sends_each_due_timer_once() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    clock.advance(WAIT_MS)

    first = await harness.fire_due_timers()
    second = await harness.fire_due_timers()

    assert len(first) == 1
    assert second == []
    assert harness.outputs() == [(KEY, TIMEOUT_OUTPUT)]


# 3. TimerIndex --------------------------------------------------------------------------------


def timers(**deadlines: int) -> KeyState:
    """A state with the given timers armed, each token naming its kind and deadline."""
    return KeyState(
        timers={
            kind: ArmedTimer(deadline_ms=deadline, token=timer_token(kind, 1, deadline))  # type: ignore[misc]
            for kind, deadline in deadlines.items()
        }
    )


def due_of(index: TimerIndex, now_ms: int) -> list[tuple[bytes, str, int]]:
    return [(key, kind, timer.deadline_ms) for key, kind, timer in index.due(now_ms)]


def test_timer_index_returns_due_timers_in_deadline_order_once_per_token() -> None:
    index = TimerIndex()
    index.update(b"a", timers(hitl=100, ttl=300))
    index.update(b"b", timers(ttl=50))

    assert due_of(index, 99) == [(b"b", "ttl", 50)]
    assert due_of(index, 300) == [(b"a", "hitl", 100), (b"a", "ttl", 300)]
    assert due_of(index, 10_000) == []
    assert len(index) == 2


def test_timer_index_returns_a_timer_recorded_twice_with_the_same_token_once() -> None:
    index = TimerIndex()
    index.update(b"a", timers(ttl=100))
    index.update(b"a", timers(ttl=100))

    assert due_of(index, 100) == [(b"a", "ttl", 100)]
    index.update(b"a", timers(ttl=100))  # re-armed with a token already sent
    assert due_of(index, 200) == []


def test_timer_index_skips_tokens_superseded_by_an_update() -> None:
    index = TimerIndex()
    index.update(b"a", timers(hitl=100, ttl=200))
    index.update(b"a", timers(ttl=500))  # the suspension ended; TTL moved

    assert due_of(index, 499) == []
    assert due_of(index, 500) == [(b"a", "ttl", 500)]


def test_timer_index_forgets_a_deleted_key() -> None:
    index = TimerIndex()
    index.update(b"a", timers(ttl=100))
    index.update(b"a", None)

    assert len(index) == 0
    assert due_of(index, 1_000) == []


def test_timer_index_rebuild_starts_over_from_the_given_states() -> None:
    index = TimerIndex()
    index.update(b"a", timers(ttl=100))
    index.update(b"gone", timers(ttl=100))
    assert len(due_of(index, 100)) == 2

    index.rebuild([(b"a", timers(ttl=100)), (b"new", timers(hitl=150)), (b"idle", KeyState())])

    assert len(index) == 2
    assert due_of(index, 200) == [
        (b"a", "ttl", 100),
        (b"new", "hitl", 150),
    ]  # sent again: a crash may have lost it
    assert due_of(index, 200) == []


def test_timer_index_resend_makes_a_timer_due_again_unless_superseded() -> None:
    index = TimerIndex()
    index.update(b"a", timers(ttl=100))
    [(key, kind, timer)] = index.due(100)

    index.resend(key, kind, timer)
    assert due_of(index, 100) == [(b"a", "ttl", 100)]
    assert due_of(index, 100) == []

    index.resend(key, kind, timer)
    index.update(b"a", timers(ttl=900))
    assert due_of(index, 100) == []


def test_a_sent_fire_is_sent_again_while_the_state_still_holds_its_token() -> None:
    index = TimerIndex()
    state = arm(KeyState(seq=3), ttl_ms=1_000, now_ms=0)
    index.update(KEY, state)

    assert [kind for _, kind, _ in index.due(1_000)] == [TTL]
    assert index.due(1_000 + RESEND_AFTER_MS - 1) == [], "not again before the resend interval"
    assert [kind for _, kind, _ in index.due(1_000 + RESEND_AFTER_MS)] == [TTL], (
        "sent again: it was not applied"
    )
    index.update(KEY, KeyState(seq=4))
    assert index.due(1_000 + 3 * RESEND_AFTER_MS) == [], "once the state moved on, never again"


def test_the_timer_index_grows_with_keys_not_with_commits() -> None:
    """Every commit re-arms the TTL; 200 commits per key over 100 keys must not leave 20,000
    heap entries behind (it grew by one entry per commit)."""
    from keylane.core.timers import COMPACT_FACTOR, COMPACT_SLACK

    index = TimerIndex()
    for commit in range(200):
        for k in range(100):
            state = arm(KeyState(seq=commit), ttl_ms=3_600_000, now_ms=1_000 * commit)
            index.update(f"k{k}".encode(), state)
    assert len(index) == 100
    assert len(index._heap) <= COMPACT_FACTOR * 100 + COMPACT_SLACK
    due = index.due(1_000 * 199 + 3_600_000)
    assert len(due) == 100, "each key's latest TTL is still due exactly once"


def test_compaction_keeps_every_armed_timer_and_the_resend_interval_of_a_sent_one() -> None:
    """The compaction builds the heap from the armed timers: a timer sent before it is still not
    sent again before RESEND_AFTER_MS, and is once that passed; a timer superseded by then is
    not sent at all."""
    from keylane.core.timers import COMPACT_FACTOR, COMPACT_SLACK

    index = TimerIndex()
    sent = arm(KeyState(seq=1), ttl_ms=1_000, now_ms=0)
    index.update(KEY, sent)
    assert [kind for _, kind, _ in index.due(1_000)] == [TTL]
    commits, compacted = 0, False
    # Another key re-armed earlier and earlier until the heap compacts: a timer that moved
    # later adds no entry (test_a_timer_re_armed_later_adds_no_entry).
    while not compacted:
        commits += 1
        before = len(index._heap)
        index.update(b"b", arm(KeyState(seq=commits), ttl_ms=120_000 - commits, now_ms=0))
        compacted = len(index._heap) < before
        assert commits <= COMPACT_FACTOR * 3 + COMPACT_SLACK, "the heap never compacted"
    assert len(index._heap) == 2, "one entry per armed timer"

    assert index.due(1_000 + RESEND_AFTER_MS - 1) == [], "the sent timer waits out its interval"
    assert [key for key, _, _ in index.due(1_000 + RESEND_AFTER_MS)] == [KEY]
    index.update(KEY, KeyState(seq=2))
    due = index.due(120_000 + 2 * RESEND_AFTER_MS)
    assert [key for key, _, _ in due] == [b"b"], "the latest TTL once, the superseded none"


def test_a_timer_re_armed_later_adds_no_entry_and_is_due_at_its_new_deadline() -> None:
    """Every commit moves its key's TTL later; the index keeps the entry it has (the earlier
    deadline) and, when that one pops, puts the armed timer back at its own."""
    index = TimerIndex()
    for commit in range(50):
        for k in range(10):
            index.update(f"k{k}".encode(), arm(KeyState(seq=commit), ttl_ms=1_000, now_ms=commit))
    assert len(index._heap) == 10, "one entry per key, however many commits"

    assert index.due(1_000 + 48) == [], "the first deadlines passed, the armed ones did not"
    due = index.due(1_000 + 49)
    assert sorted(key for key, _, _ in due) == [f"k{k}".encode() for k in range(10)]
    assert {timer.token for _, _, timer in due} == {timer_token(TTL, 49, 1_049)}, "each key's latest TTL"


def test_a_timer_re_armed_with_the_same_deadline_and_a_new_token_is_due_once() -> None:
    index = TimerIndex()
    index.update(KEY, arm(KeyState(seq=1), ttl_ms=1_000, now_ms=0))
    index.update(KEY, arm(KeyState(seq=2), ttl_ms=1_000, now_ms=0))

    [(_, _, timer)] = index.due(1_000)
    assert timer.token == timer_token(TTL, 2, 1_000)
    assert index.due(1_000) == []


def test_a_sent_timer_re_armed_before_its_resend_is_due_at_its_new_deadline() -> None:
    """A sent timer's entry waits RESEND_AFTER_MS; a timer armed in its place before then is
    due at its own deadline, not at the old one's resend."""
    index = TimerIndex()
    index.update(KEY, arm(KeyState(seq=1), ttl_ms=1_000, now_ms=0))
    assert [kind for _, kind, _ in index.due(1_000)] == [TTL]

    index.update(KEY, arm(KeyState(seq=2), ttl_ms=1_000, now_ms=1_000))
    assert index.due(1_999) == []
    [(_, _, timer)] = index.due(2_000)
    assert timer.token == timer_token(TTL, 2, 2_000)


# 4. The keys waiting now (keylane_waiting_keys) ------------------------------------------------


async def test_the_index_counts_suspended_keys_by_what_they_wait_for() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    index = harness.timers

    assert (index.waiting("approval"), index.waiting("tool")) == (1, 0)

    [request] = harness.approval_requests()
    await harness.send_approval(approval(request.intent_id))

    assert harness.state(KEY).continuation is None
    assert (index.waiting("approval"), index.waiting("tool")) == (0, 0)


def test_waiting_follows_each_commit_and_a_rebuild_starts_over() -> None:
    def suspended(kind: IntentKind) -> KeyState:
        cont = Continuation(seq=0, step_index=1, pending_intent_ids=["i-1", "i-2"], deadline_ms=MINUTE)
        pending = {
            "i-1": PendingIntent(intent_id="i-1", tool="refund", kind="tool"),
            "i-2": PendingIntent(intent_id="i-2", tool="hitl", kind=kind),
        }
        return KeyState(continuation=cont, pending=pending)

    index = TimerIndex()
    index.update(b"a", suspended("approval"))  # a tool result and an approval: counts as approval
    index.update(b"b", suspended("tool"))
    index.update(b"c", KeyState())
    assert (index.waiting("approval"), index.waiting("tool")) == (1, 1)

    index.update(b"a", suspended("tool"))
    index.update(b"b", None)  # deleted
    assert (index.waiting("approval"), index.waiting("tool")) == (0, 1)

    index.rebuild([(b"x", suspended("approval")), (b"y", KeyState())])  # another assignment
    assert (index.waiting("approval"), index.waiting("tool")) == (1, 0)
