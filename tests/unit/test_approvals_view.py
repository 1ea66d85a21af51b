"""What `keylane approvals list` and `keylane approve` read from the topics (keylane.approvals),
broker-free: the outcome the agent saw, and why a decision would resume nothing.

The records are built as the topics hold them (TopicRecord: key, value, headers, partition,
offset, Kafka timestamp). The last tests drive the real runtime (AgentHarness) and check the
view against what the agent did.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from keylane.approvals import (
    CLOSE_CALL_MS,
    RequestView,
    refusal,
    request_views,
    requests_of,
    sent_decisions,
)
from keylane.authoring.hitl import Escalate, HitlPolicy
from keylane.kafka.topic_reader import TopicRecord
from keylane.records import ORIGIN_HEADER
from keylane.signing import Keyring
from keylane.testing import ManualClock
from keylane.wire import Approval, ApprovalRequest, encode
from tests.unit.hitl_support import HOUR, KEY, TIMEOUT_OUTPUT, WAIT_MS, approval, asked

TOPIC = "t.agent.approvals"
T0 = 1_700_000_000_000
DEADLINE = T0 + WAIT_MS
INTENT = "0c5d0f2e-7a8b-5c1d-9e3f-112233445566"


def request(
    intent_id: str = INTENT, *, key: str = "claim-42", created: int = T0, deadline: int = DEADLINE
) -> ApprovalRequest:
    return ApprovalRequest(
        intent_id=intent_id,
        entity_key=key,
        channel="approval",
        args_json='{"refund": 500}',
        created_at_ms=created,
        expires_at_ms=max(deadline, created + HOUR),
        deadline_ms=deadline,
    )


def record(
    value: bytes | None,
    *,
    at: int,
    offset: int,
    partition: int = 2,
    key: bytes = b"claim-42",
    headers: dict[str, bytes] | None = None,
) -> TopicRecord:
    return TopicRecord(key, value, headers or {}, partition, offset, at)


def decided(
    at: int,
    offset: int,
    *,
    approved: bool = True,
    approver: str = "ann",
    key: str = "claim-42",
    intent_id: str = INTENT,
) -> TopicRecord:
    decision = Approval(intent_id=intent_id, entity_key=key, approved=approved, approver=approver)
    return record(encode(decision), at=at, offset=offset, key=key.encode())


def views_of(
    decisions: Sequence[TopicRecord],
    *,
    now: int,
    requests: Sequence[ApprovalRequest] = (),
) -> list[RequestView]:
    return request_views(list(requests) or [request()], sent_decisions(decisions, topic=TOPIC), now_ms=now)


def the_view(decisions: Sequence[TopicRecord], *, now: int) -> RequestView:
    [view] = views_of(decisions, now=now)
    return view


# -- status: the first decision before the deadline wins ----------------------------------


def test_a_request_nobody_answered_is_pending_until_its_deadline_then_expired() -> None:
    assert the_view([], now=DEADLINE - 1).status == "pending"
    assert the_view([], now=DEADLINE).status == "expired"


def test_approved_then_denied_lists_as_approved_with_the_denial_ignored() -> None:
    view = the_view(
        [decided(T0 + 1_000, 0), decided(T0 + 2_000, 1, approved=False, approver="bob")], now=DEADLINE + 1
    )

    assert view.status == "approved"
    assert view.decision is not None and view.decision.approval.approver == "ann"
    assert view.notes == ("by ann", "later denial by bob ignored")


def test_a_timed_out_request_approved_late_stays_expired() -> None:
    view = the_view([decided(DEADLINE + 40_000, 0, approver="carl")], now=DEADLINE + 60_000)

    assert view.status == "expired"
    assert view.decision is None
    assert view.notes == ("approved by carl 40 s after the deadline: ignored",)


def test_a_decision_just_before_the_deadline_is_too_close_to_call() -> None:
    view = the_view(
        [decided(DEADLINE - 500, 0, approved=False), decided(DEADLINE + 10, 1, approver="bob")],
        now=DEADLINE + 1_000,
    )

    assert view.status == "in-doubt"
    assert view.notes == (
        "denied by ann 0.5 s before the deadline: too close to call",
        "later approval by bob ignored",
    )
    assert the_view([decided(DEADLINE - CLOSE_CALL_MS - 1, 0)], now=DEADLINE).status == "approved"


def test_the_worker_reads_a_partition_in_offset_order_whatever_the_timestamps_say() -> None:
    # bob's clock runs behind: his later record carries the earlier timestamp.
    view = the_view(
        [decided(T0 + 5_000, 7, approver="ann"), decided(T0 + 1_000, 8, approved=False, approver="bob")],
        now=T0 + 6_000,
    )

    assert (view.status, view.notes) == ("approved", ("by ann", "later denial by bob ignored"))


def test_a_decision_under_another_key_is_named_and_decides_nothing() -> None:
    view = the_view([decided(T0 + 1_000, 0, key="claim-43")], now=T0 + 2_000)

    assert view.status == "pending"
    assert view.notes == ("approved by ann under key claim-43: ignored (not this request's key)",)


def test_a_late_decision_may_count_when_a_later_request_of_the_key_escalated() -> None:
    escalation = request("escalation-1", created=DEADLINE + 300, deadline=DEADLINE + 60_000)
    views = views_of(
        [decided(DEADLINE + 10_000, 0), decided(DEADLINE + 70_000, 1, approver="bob")],
        now=DEADLINE + 80_000,
        requests=[request(), escalation],
    )

    assert views[0].status == "expired"
    assert views[0].notes == (
        "approved by ann 10 s after the deadline: ignored unless the timeout policy escalated to "
        "escalation-1",
        "approved by bob 70 s after the deadline: ignored",
    )


def test_under_required_signatures_an_unsigned_decision_decides_nothing() -> None:
    keyring = Keyring.parse("2026-11:secret")
    signed = keyring.sign(Approval(intent_id=INTENT, entity_key="claim-42", approved=False, approver="ann"))
    records = [
        decided(T0 + 1_000, 0, approver="mallory"),
        record(encode(signed), at=T0 + 2_000, offset=1),
    ]

    [view] = request_views(
        [request()], sent_decisions(records, topic=TOPIC), now_ms=T0 + 3_000, verify=keyring.verify
    )

    assert view.status == "denied"
    assert view.notes == ("approved by mallory refused as unsigned_approval (unsigned)", "by ann")
    assert the_view(records, now=T0 + 3_000).status == "approved"  # signatures off: mallory's counts


# -- reading the topics -------------------------------------------------------------------


def test_a_rerouted_decision_counts_once_as_the_copy_the_worker_reads() -> None:
    original = decided(DEADLINE - 60_000, 5)
    original = record(original.value, at=original.timestamp_ms, offset=5, partition=0)
    origin = {ORIGIN_HEADER: f"{TOPIC}/0/5".encode()}
    copy = record(original.value, at=DEADLINE + 3_000, offset=9, headers=origin)
    second_copy = record(original.value, at=DEADLINE + 9_000, offset=12, headers=origin)

    [decision] = sent_decisions([original, copy, second_copy], topic=TOPIC)

    assert (decision.partition, decision.offset, decision.timestamp_ms) == (2, 9, DEADLINE + 3_000)
    assert the_view([original, copy, second_copy], now=DEADLINE + 10_000).status == "expired"


def test_records_the_worker_refuses_as_malformed_are_skipped() -> None:
    wrong_record_key = record(decided(T0, 0).value, at=T0 + 1, offset=0, key=b"claim-43")
    not_json = record(b"{approved", at=T0 + 2, offset=1)

    assert sent_decisions([wrong_record_key, not_json, record(None, at=T0, offset=2)], topic=TOPIC) == []


def test_a_request_published_again_after_a_crash_is_listed_once() -> None:
    value = encode(request())
    requests = requests_of(
        [record(value, at=T0, offset=0), record(b"junk", at=T0, offset=1), record(value, at=T0, offset=2)]
    )

    assert requests == [request()]


def test_json_has_one_object_per_request_with_the_decision_and_notes() -> None:
    view = the_view([decided(T0 + 1_000, 0, approver="ann")], now=T0 + 2_000)

    shown = json.loads(json.dumps(view.to_json()))

    assert shown["key"] == "claim-42"
    assert shown["intent_id"] == INTENT
    assert shown["status"] == "approved"
    assert shown["deadline_ms"] == DEADLINE
    assert shown["decision"]["approver"] == "ann"
    assert shown["decision"]["timestamp_ms"] == T0 + 1_000
    assert shown["notes"] == ["by ann"]
    assert the_view([], now=T0).to_json()["decision"] is None


# -- refusals of `keylane approve` --------------------------------------------------------


def test_approving_a_waiting_request_is_not_refused() -> None:
    assert refusal(views_of([], now=T0), key="claim-42", intent_id=INTENT, now_ms=T0) is None


def test_an_intent_nobody_requested_is_refused_with_what_to_do() -> None:
    why = refusal(views_of([], now=T0), key="claim-42", intent_id="not-a-uuid", now_ms=T0)

    assert why == (
        "no approval request for intent not-a-uuid on key claim-42; 'keylane approvals list' shows "
        "the waiting ones, --force sends the decision anyway"
    )


def test_the_right_intent_under_the_wrong_key_names_the_right_key() -> None:
    why = refusal(views_of([], now=T0), key="claim-4", intent_id=INTENT, now_ms=T0)

    assert why is not None
    assert why.startswith(
        f"intent {INTENT} was requested on key claim-42, not claim-4: run again with --key claim-42"
    )


def test_a_decided_request_says_how_and_by_whom() -> None:
    views = views_of([decided(T0 + 1_000, 0, approved=False, approver="bob")], now=T0 + 5_000)

    why = refusal(views, key="claim-42", intent_id=INTENT, now_ms=T0 + 5_000)

    assert why == (
        f"request {INTENT} on key claim-42 was already denied by bob at 2023-11-14 22:13:21 UTC: "
        "the agent resumed on that decision and ignores another; --force sends the decision anyway"
    )


def test_a_close_call_is_refused_as_decided_either_way() -> None:
    views = views_of([decided(DEADLINE - 300, 0)], now=DEADLINE + 1)

    why = refusal(views, key="claim-42", intent_id=INTENT, now_ms=DEADLINE + 1)

    assert (
        why is not None and "was already approved by ann 0.3 s before its deadline, too close to call" in why
    )


def test_a_request_past_its_deadline_says_the_agent_took_its_timeout_path() -> None:
    now = DEADLINE + 90_000
    why = refusal(views_of([], now=now), key="claim-42", intent_id=INTENT, now_ms=now)

    assert why == (
        f"the deadline of request {INTENT} on key claim-42 passed at 2023-11-14 22:23:20 UTC (90 s ago): "
        "the agent already took its timeout path (its HITL policy), so this decision would be ignored; "
        "--force sends the decision anyway"
    )


def test_a_request_past_its_deadline_points_at_the_request_of_its_key_that_waits() -> None:
    now = DEADLINE + 5_000
    views = views_of(
        [],
        now=now,
        requests=[request(), request("escalation-1", created=DEADLINE + 200, deadline=now + 60_000)],
    )

    why = refusal(views, key="claim-42", intent_id=INTENT, now_ms=now)

    assert why is not None
    assert "request escalation-1 of this key, asked since, is the one waiting; --force" in why


# -- the view agrees with the runtime -----------------------------------------------------


def as_topic(requests: Sequence[ApprovalRequest], sent: Sequence[tuple[int, Approval]]) -> list[RequestView]:
    """The view of what a harness published and the decisions sent to it, each decision's
    Kafka timestamp being the harness clock when it was sent."""
    decisions = [
        record(encode(a), at=at, offset=i, key=a.entity_key.encode()) for i, (at, a) in enumerate(sent)
    ]
    return request_views(requests, sent_decisions(decisions, topic=TOPIC), now_ms=sent[-1][0] + 1)


@pytest.mark.parametrize("fire_first", [True, False], ids=["after-the-fire", "before-the-fire"])
async def test_a_late_approval_is_expired_in_the_view_as_in_the_runtime(fire_first: bool) -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    [asked_for] = harness.approval_requests()
    clock.advance(WAIT_MS + 40_000)
    if fire_first:
        await harness.fire_due_timers()
    late = approval(asked_for.intent_id)
    sent_at = clock.now_ms
    await harness.send_approval(late)

    [view] = as_topic([asked_for], [(sent_at, late)])

    [orphan] = [e for e in harness.errors() if e.reason == "orphaned_result"]
    assert orphan.detail == ("no_continuation" if fire_first else "deadline_passed")
    assert view.status == "expired"
    assert view.notes == ("approved by ana 40 s after the deadline: ignored",)


async def test_approved_then_denied_is_approved_in_the_view_as_in_the_runtime() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    [asked_for] = harness.approval_requests()
    sent = []
    for approved in (True, False):
        clock.advance(1_000)
        decision = approval(asked_for.intent_id, approved=approved)
        sent.append((clock.now_ms, decision))
        await harness.send_approval(decision)

    [view] = as_topic([asked_for], sent)

    assert harness.outputs() == [(KEY, b"approved after ask")]
    assert harness.errors() == []  # the later denial is acknowledged, not dead-lettered
    assert (view.status, view.notes) == ("approved", ("by ana", "later denial by ana ignored"))


async def test_an_escalated_request_still_resumes_on_a_late_decision_as_the_view_warns() -> None:
    clock = ManualClock()
    policy = HitlPolicy(
        timeout_ms=WAIT_MS,
        intent_ttl_ms=HOUR,
        max_escalations=1,
        on_timeout=lambda _: Escalate(tool_name="managers", args_json="{}", timeout_ms=WAIT_MS),
    )
    harness, _ = await asked(clock, policy=policy)
    [first] = harness.approval_requests()
    clock.advance(WAIT_MS)
    await harness.fire_due_timers()
    clock.advance(10_000)
    late = approval(first.intent_id)
    await harness.send_approval(late)

    views = as_topic(harness.approval_requests(), [(clock.now_ms, late)])

    assert harness.outputs() == [(KEY, b"approved after ask")]
    assert TIMEOUT_OUTPUT not in [value for _, value in harness.outputs()]
    escalation = harness.approval_requests()[1]
    assert views[0].notes == (
        f"approved by ana 10 s after the deadline: ignored unless the timeout policy escalated to "
        f"{escalation.intent_id}",
    )
