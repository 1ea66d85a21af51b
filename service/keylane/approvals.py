"""Approving from the outside: publish a decision, list what waits for one."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from keylane.catalog import APPROVAL_REQUESTS, APPROVALS, Catalog
from keylane.config import Settings
from keylane.kafka.producer import producer
from keylane.kafka.topic_reader import read_to_end
from keylane.wire import Approval, ApprovalRequest, MalformedRecord, decode, encode

RequestStatus = Literal["pending", "approved", "denied", "expired"]


@dataclass(frozen=True)
class RequestView:
    """An approval request and where it stands."""

    request: ApprovalRequest
    status: RequestStatus


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
    signed when signing keys are configured."""
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
    """Every approval request with its status: decided (by a later approval), expired (its
    deadline passed) or pending. Records that do not decode are skipped."""
    decisions: dict[str, bool] = {}
    for record in await read_to_end(settings, catalog.name(APPROVALS)):
        try:
            approval = decode(record.value, Approval)
        except MalformedRecord:
            continue
        decisions[approval.intent_id] = approval.approved
    views = []
    for record in await read_to_end(settings, catalog.name(APPROVAL_REQUESTS)):
        try:
            request = decode(record.value, ApprovalRequest)
        except MalformedRecord:
            continue
        status: RequestStatus
        if request.intent_id in decisions:
            status = "approved" if decisions[request.intent_id] else "denied"
        elif request.deadline_ms <= now_ms:
            status = "expired"
        else:
            status = "pending"
        views.append(RequestView(request, status))
    return views
