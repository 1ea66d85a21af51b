"""Approving from the outside: publish a decision, and list requests with the outcome the
agent saw.

What the worker does with a decision (resume admission, service/keylane/core/activation.py,
and the HITL timer, service/keylane/core/timeouts.py), which this module reads back from
agent.approval-requests and agent.approvals alone:

1. the first decision its worker reads before the request's deadline resumes the agent;
2. a later decision for the same request is acknowledged and changes nothing (no error);
3. a decision read at or after the deadline changes nothing: it is an ``orphaned_result``
   (``deadline_passed`` while the suspension waits for its timer to fire, ``no_continuation``
   once the timer fired and the timeout policy ended it, ``unknown_intent`` once the key
   suspended again on another request);
4. a decision under another physical key reaches another key's lane, where nothing waits
   for it (``no_continuation`` or ``unknown_intent``);
5. under ``KEYLANE_APPROVAL_SIGNATURES=require`` a decision without a valid signature is
   refused (``unsigned_approval``) before any of this, as if it had not been sent.

The one exception: a timeout policy that escalates keeps the suspension, and the original
request with it, open until the escalation's deadline; the notes say so where it may apply.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from keylane.catalog import APPROVAL_REQUESTS, APPROVALS, Catalog
from keylane.config import Settings
from keylane.errors import ConfigError, KeylaneError
from keylane.kafka.producer import producer
from keylane.kafka.topic_reader import TopicRecord, read_to_end
from keylane.records import origin_of
from keylane.signing import Verdict, parse_mode
from keylane.wire import Approval, ApprovalRequest, MalformedRecord, decode, encode

RequestStatus = Literal["pending", "approved", "denied", "expired", "in-doubt"]
"""Where a request stands for its agent. ``in-doubt``: its first decision was sent so close
to the deadline (CLOSE_CALL_MS) that the topics cannot tell whether the worker read it in
time; an ``orphaned_result`` for its intent on agent.errors says it did not."""

CLOSE_CALL_MS = 2_000
"""How long before a deadline a decision is too close to call. The worker judges a decision
by its own clock when it reads it, which is after the record's timestamp by the time its
fetch takes: well under this for a worker that keeps up (one that was down or lagging reads
even early decisions late, and refuses them; its consumer lag shows that)."""


class ApprovalRefused(KeylaneError):
    """``keylane approve`` found no request waiting for the decision: the message says why
    and what to do instead (``--force`` sends it anyway)."""


@dataclass(frozen=True)
class SentDecision:
    """One decision as the worker applies it: the Approval, and the Kafka timestamp and
    position of the record its worker reads (for a re-routed decision, the copy in the key's
    partition, which the worker reads instead of the original)."""

    approval: Approval
    timestamp_ms: int
    partition: int
    offset: int

    @property
    def verdict(self) -> Literal["approved", "denied"]:
        return "approved" if self.approval.approved else "denied"

    @property
    def noun(self) -> str:
        return "approval" if self.approval.approved else "denial"


@dataclass(frozen=True)
class RequestView:
    """An approval request, where it stands for its agent, the decision the agent resumed on
    (or the close call, when in doubt) and what happened to every other decision sent for it."""

    request: ApprovalRequest
    status: RequestStatus
    decision: SentDecision | None = None
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """One JSON object for ``keylane approvals list --json``."""
        request, decision = self.request, self.decision
        return {
            "key": request.entity_key,
            "intent_id": request.intent_id,
            "channel": request.channel,
            "status": self.status,
            "created_at_ms": request.created_at_ms,
            "deadline_ms": request.deadline_ms,
            "expires_at_ms": request.expires_at_ms,
            "args_json": request.args_json,
            "decision": None
            if decision is None
            else {
                "approved": decision.approval.approved,
                "approver": decision.approval.approver,
                "reason": decision.approval.reason,
                "decided_at_ms": decision.approval.decided_at_ms,
                "timestamp_ms": decision.timestamp_ms,
            },
            "notes": list(self.notes),
        }


async def send_approval(
    settings: Settings,
    catalog: Catalog,
    *,
    key: str,
    intent_id: str,
    approved: bool,
    approver: str,
    reason: str | None,
) -> Approval:
    """Publish one decision under the physical key (murmur2, so it lands in the key's lane),
    signed when signing keys are configured. It checks nothing: see :func:`check_waiting`."""
    approval = settings.keyring().sign(
        Approval(
            intent_id=intent_id,
            entity_key=key,
            approved=approved,
            approver=approver,
            reason=reason,
            decided_at_ms=time.time_ns() // 1_000_000,
        )
    )
    async with producer(settings) as kafka:
        await kafka.send_and_wait(catalog.name(APPROVALS), key=key.encode(), value=encode(approval))
    return approval


async def approval_requests(settings: Settings, catalog: Catalog, *, now_ms: int) -> list[RequestView]:
    """Every approval request with the outcome its agent saw (:func:`request_views`). The
    signature checks are the worker's when ``settings`` has its KEYLANE_APPROVAL_SIGNATURES
    and KEYLANE_SIGNING_KEYS."""
    mode = parse_mode(settings.approval_signatures, "KEYLANE_APPROVAL_SIGNATURES")
    requests, decisions = await asyncio.gather(
        _read(settings, catalog.name(APPROVAL_REQUESTS)),
        _read(settings, catalog.name(APPROVALS)),
        return_exceptions=True,
    )
    # Report the requests' topic first, whichever read failed first: one message per cause.
    if isinstance(requests, BaseException):
        raise requests
    if isinstance(decisions, BaseException):
        raise decisions
    return request_views(
        requests_of(requests),
        sent_decisions(decisions, topic=catalog.name(APPROVALS)),
        now_ms=now_ms,
        verify=settings.keyring().verify if mode == "require" else None,
    )


async def check_waiting(
    settings: Settings, catalog: Catalog, *, key: str, intent_id: str, now_ms: int
) -> RequestView:
    """The request a decision for ``intent_id`` under ``key`` would answer; ApprovalRefused
    when none waits for it (:func:`refusal`). A deadline can still pass between this check
    and the decision's arrival: the decision then changes nothing, as any late one."""
    views = await approval_requests(settings, catalog, now_ms=now_ms)
    why = refusal(views, key=key, intent_id=intent_id, now_ms=now_ms)
    if why is not None:
        raise ApprovalRefused(why)
    return next(v for v in views if v.request.intent_id == intent_id and v.request.entity_key == key)


def requests_of(records: Iterable[TopicRecord]) -> list[ApprovalRequest]:
    """The requests on agent.approval-requests, in order, each once (a worker that crashed
    before Kafka confirmed a request publishes it again). Records that do not decode are
    skipped."""
    requests: dict[str, ApprovalRequest] = {}
    for record in records:
        try:
            request = decode(record.value, ApprovalRequest)
        except MalformedRecord:
            continue
        requests.setdefault(request.intent_id, request)
    return list(requests.values())


def sent_decisions(records: Iterable[TopicRecord], *, topic: str) -> list[SentDecision]:
    """The decisions on agent.approvals (named ``topic`` on the broker), one per record the
    worker applies. A re-routed decision (sent to another partition than its key's, e.g. by
    kcat) counts once, as its first copy: that is the record the worker reads. Records the
    worker refuses as malformed (not decodable, or a record key that differs from
    ``entity_key``) are skipped."""
    originals: dict[tuple[str, int, int], TopicRecord] = {}
    copies: dict[tuple[str, int, int], TopicRecord] = {}
    for record in records:
        origin = origin_of(record.headers)
        if origin is None:
            originals[(topic, record.partition, record.offset)] = record
        else:
            first = copies.get(origin)
            if first is None or (record.partition, record.offset) < (first.partition, first.offset):
                copies[origin] = record
    decisions = []
    for record in {**originals, **copies}.values():  # a copy replaces its original
        try:
            approval = decode(record.value, Approval)
        except MalformedRecord:
            continue
        if record.key != approval.entity_key.encode():
            continue
        decisions.append(SentDecision(approval, record.timestamp_ms, record.partition, record.offset))
    return decisions


def request_views(
    requests: Sequence[ApprovalRequest],
    decisions: Sequence[SentDecision],
    *,
    now_ms: int,
    close_call_ms: int = CLOSE_CALL_MS,
    verify: Callable[[Approval], Verdict] | None = None,
) -> list[RequestView]:
    """Each request with the outcome its agent saw, judged as the worker judges (the module
    docstring): the first decision under the request's key sent before its deadline decides;
    one sent within ``close_call_ms`` of the deadline leaves it ``in-doubt``; without one the
    request is ``pending`` until its deadline and ``expired`` after it, whatever came later.
    With ``verify`` (the worker requires signatures), a decision it does not find ``ok`` is
    refused and decides nothing.

    A decision is judged by its record's Kafka timestamp, not its ``decided_at_ms``: the
    timestamp is set as the record is sent, so the worker, which compares its own clock with
    the deadline when it reads the record, never reads it earlier than that (clocks in sync);
    ``decided_at_ms`` is taken before the producer connects, and a decision written by kcat
    or another client may not carry it at all."""
    by_intent: dict[str, list[SentDecision]] = {}
    for decision in decisions:
        by_intent.setdefault(decision.approval.intent_id, []).append(decision)
    return [
        _view(request, by_intent.get(request.intent_id, []), requests, now_ms, close_call_ms, verify)
        for request in requests
    ]


def refusal(views: Sequence[RequestView], *, key: str, intent_id: str, now_ms: int) -> str | None:
    """Why a decision for ``intent_id`` under ``key`` would resume nothing, in one line that
    says what to do instead, or None when that request is waiting for one."""
    force = "--force sends the decision anyway"
    matching = [v for v in views if v.request.intent_id == intent_id]
    view = next((v for v in matching if v.request.entity_key == key), None)
    if view is None:
        if matching:
            other = matching[0].request.entity_key
            return (
                f"intent {intent_id} was requested on key {other}, not {key}: run again with "
                f"--key {other} (under another key a decision resumes nothing); {force}"
            )
        return (
            f"no approval request for intent {intent_id} on key {key}; "
            f"'keylane approvals list' shows the waiting ones, {force}"
        )
    request, decision = view.request, view.decision
    if view.status == "pending":
        return None
    if decision is not None and view.status == "in-doubt":
        before = span(request.deadline_ms - decision.timestamp_ms)
        return (
            f"request {intent_id} on key {key} was already {decision.verdict} by "
            f"{decision.approval.approver} {before} before its deadline, too close to call whether "
            f"the agent saw it in time (an orphaned_result for it on agent.errors says it did not); "
            f"another decision is ignored either way; {force}"
        )
    if decision is not None:
        return (
            f"request {intent_id} on key {key} was already {decision.verdict} by "
            f"{decision.approval.approver} at {_utc(decision.timestamp_ms)}: the agent resumed on "
            f"that decision and ignores another; {force}"
        )
    passed = (
        f"the deadline of request {intent_id} on key {key} passed at {_utc(request.deadline_ms)} "
        f"({span(now_ms - request.deadline_ms)} ago): the agent already took its timeout path "
        "(its HITL policy)"
    )
    waiting = [
        v.request.intent_id
        for v in views
        if v.status == "pending"
        and v.request.entity_key == key
        and v.request.created_at_ms >= request.deadline_ms
    ]
    if waiting:
        return f"{passed}; request {waiting[0]} of this key, asked since, is the one waiting; {force}"
    return f"{passed}, so this decision would be ignored; {force}"


def _view(
    request: ApprovalRequest,
    decisions: list[SentDecision],
    requests: Sequence[ApprovalRequest],
    now_ms: int,
    close_call_ms: int,
    verify: Callable[[Approval], Verdict] | None,
) -> RequestView:
    deadline = request.deadline_ms
    chosen: SentDecision | None = None
    status: RequestStatus = "pending" if now_ms < deadline else "expired"
    notes: list[str] = []
    for decision in _lane_order([d for d in decisions if d.approval.entity_key == request.entity_key]):
        approver = decision.approval.approver
        verdict = "ok" if verify is None else verify(decision.approval)
        if verdict != "ok":
            notes.append(f"{decision.verdict} by {approver} refused as unsigned_approval ({verdict})")
        elif chosen is not None:
            notes.append(f"later {decision.noun} by {approver} ignored")
        elif decision.timestamp_ms < deadline - close_call_ms:
            chosen, status = decision, decision.verdict
            notes.append(f"by {approver}")
        elif decision.timestamp_ms < deadline:
            chosen, status = decision, "in-doubt"
            before = span(deadline - decision.timestamp_ms)
            notes.append(f"{decision.verdict} by {approver} {before} before the deadline: too close to call")
        else:
            after = span(decision.timestamp_ms - deadline)
            late = f"{decision.verdict} by {approver} {after} after the deadline: ignored"
            escalation = _escalation_open_for(request, decision, requests)
            if escalation is not None:
                late += f" unless the timeout policy escalated to {escalation}"
            notes.append(late)
    for decision in decisions:
        if decision.approval.entity_key != request.entity_key:
            notes.append(
                f"{decision.verdict} by {decision.approval.approver} under key "
                f"{decision.approval.entity_key}: ignored (not this request's key)"
            )
    return RequestView(request, status, chosen, tuple(notes))


def _escalation_open_for(
    request: ApprovalRequest, decision: SentDecision, requests: Sequence[ApprovalRequest]
) -> str | None:
    """The intent of a later request of the same key that may be ``request``'s escalation and
    was still open when ``decision`` was sent, else None. An escalation keeps the original
    request open with it until the escalation's deadline (and the original intent's expiry);
    the topics do not say which request escalated which, only that one of this key was asked
    at or after the deadline, when the timer fired."""
    for later in requests:
        if (
            later.entity_key == request.entity_key
            and later.intent_id != request.intent_id
            and request.deadline_ms <= later.created_at_ms <= decision.timestamp_ms
            and decision.timestamp_ms < min(later.deadline_ms, request.expires_at_ms)
        ):
            return later.intent_id
    return None


def _lane_order(decisions: list[SentDecision]) -> list[SentDecision]:
    """Decisions in the order the worker reads them. Under one key they sit in the key's
    partition, where offsets are that order (timestamps from two approvers' clocks need not
    be); across partitions (a decision not re-routed yet) only the timestamps tell."""
    if len({d.partition for d in decisions}) <= 1:
        return sorted(decisions, key=lambda d: d.offset)
    return sorted(decisions, key=lambda d: (d.timestamp_ms, d.partition, d.offset))


async def _read(settings: Settings, topic: str) -> list[TopicRecord]:
    try:
        return await read_to_end(settings, topic)
    except LookupError as exc:
        raise ConfigError(
            f"topic {topic} does not exist: 'keylane topics apply' creates it (or set the "
            "--topic-prefix / KEYLANE_TOPIC_PREFIX the agent runs with)"
        ) from exc


def _utc(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def span(ms: int) -> str:
    """A duration for people: 0.4 s, 40 s, 12 min, 3 h, 2 d."""
    seconds = max(0, ms) / 1000
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 120 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"
