"""One agent.intents record, decided: re-route, dead-letter, answer from the store, or run.

Per record, in order (the job its partition's lane runs; see service.py for the Faust side):

1. if the record sits on another partition than Kafka's murmur2 partitioner gives its key
   (a librdkafka producer, a dead-letter re-drive), re-produce it there — same key, value
   and headers plus ``keylane.origin`` (kept if the record is a copy already) — and stop:
   the claim table is read in the partition of the record being handled, so every copy of
   an intent must be handled in its key's partition for the dedup to be global by intent id;
2. decode it; a bad record becomes ``malformed_record`` on agent.errors. So does an intent
   whose record key is not its ``entity_key``: its copies could be claimed in two
   partitions, and its result (keyed by entity_key) would answer another key's lane;
3. under ``KEYLANE_INTENT_SIGNATURES=require`` an unsigned or badly signed intent becomes
   ``unsigned_intent`` on agent.errors and its tool never runs;
4. an intent for a tool this registry does not know, and not answered yet, is held first
   (below: a newer effector may know it); then claim it (claims.py), in this order: Done
   republishes the stored result (even after the intent's expiry), after writing it again
   and flushing (step 6); InFlight waits for the holder's lease, then claims again; Expired
   answers EXPIRED; an intent the registry cannot run answers REJECTED; InDoubt is settled
   by the tool's ``reconcile`` hook or its ``in_doubt`` policy
   (service/keylane/authoring/tools.py);
5. flush the producer, so the claim is durable before the side effect; refuse the intent
   (EXPIRED) if a run could not finish before its expiry (below); run the tool, with the
   intent id, within min(its timeout, the time left before expiry less the margin);
6. sign the ToolResult (when the keyring has a signing key), record it as Done, flush the
   producer (so Kafka has the Done record), and only then hand the result to the producer,
   keyed by the intent's physical key. A Done found in the local store is written and
   flushed again before it is republished: a kill -9 between a local put and its changelog
   delivery leaves RocksDB at Done and the changelog at "claimed", and a later owner of the
   partition (a fresh volume) would restore the claim and face the intent in doubt. Every
   answer — OK, ERROR, EXPIRED, REJECTED — is recorded, so an intent id gets one answer,
   byte for byte, however often it is delivered. A result larger than ``result_limit``
   (what both the Done record and the agent.results record may take) is answered as an
   ERROR naming its size instead: the Done record could not be written, and an effector
   that cannot record Done restarts into an in-doubt claim and, for an
   ``in_doubt="rerun"`` tool, runs it again on every restart.

**Expiry: a result reaches the agent only from a run that finished in time.** The worker
refuses (``orphaned_result``, ``intent_expired``) a result it reads at or after the intent's
``expires_at_ms``, and fails the key closed; a run that straddled the expiry would have taken
effect while the agent is told it did not. So a run gets ``expires_at_ms - now -
expiry_margin_ms`` at most (``EXPIRY_MARGIN_MS``: recording Done, publishing, and the worker
reading the result): when that is not positive the intent is answered EXPIRED and never
runs; a tool still running when it is over is answered ERROR (it may still take effect, as
after its own timeout). Every OK or ERROR from a run is thus recorded and published at least
the margin before the expiry. An in-doubt intent without a reconcile hook is refused as
EXPIRED under the same rule.

**An unknown tool is held, then REJECTED for good.** During a rolling deploy a new worker's
intent can reach an old effector whose registry lacks its tool. A REJECTED answer cannot be
taken back: results of a key arrive in order, so the agent reads the REJECTED first and
settles the intent, and a newer effector that ran the tool later would take effect behind
an answer that says nothing ran. So the old effector does not answer at once: it holds the
intent up to ``unknown_tool_wait_s`` (capped by the intent's expiry less the margin),
writing nothing, re-checking for a revocation every second. A revocation (the deploy
replacing it) abandons the record, uncommitted, to the partition's next owner, which runs
the tool if its registry has it. Only an effector that held it the whole time answers
REJECTED, recorded Done like every answer, so every copy of the intent gets those same
bytes. The price: the held intent's partition waits meanwhile, so an agent asking for a
tool nobody registered delays its partition by the hold for each such intent. Other
REJECTED causes (a read-only tool, arguments that are not a JSON object) are answered at
once.

Only when ``handle`` returns is the record acked; the effector's offset commit flushes the
producer first, so an offset is committed only after its Done record and its result (or
its re-routed copy, or its dead letter) reached Kafka.

While the effector's partitions are being revoked (``revoking()``), no new attempt starts:
a record that has not claimed its intent yet is abandoned (raises ``Abandoned``, its lane
releases it uncommitted) for the next owner, so the revocation grace period only ever has
to cover an attempt that was already running when the revocation began.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from keylane import metrics
from keylane.authoring.tools import ToolRegistry, ToolSpec
from keylane.catalog import INTENTS, RESULTS
from keylane.clock import Clock, wall_clock_ms
from keylane.core.lanes import Superseded
from keylane.kafka.partitioner import expected_partition
from keylane.records import ORIGIN_HEADER, Emit, InputRecord, error_emit, origin_header
from keylane.signing import Keyring, Mode
from keylane.stages.effector.claims import ClaimStore, Done, Expired, InDoubt, InFlight
from keylane.stages.effector.execute import Runnable, check, ok_result, result_of, run, timeout_of
from keylane.wire import MalformedRecord, ToolIntent, ToolResult, decode, encode

log = logging.getLogger(__name__)

RESULT_RECORD_MARGIN_BYTES = 4096
"""Kept free below a record's limit for what wraps a result: the Done record's fields, the
record's key, headers and batch framing."""
LEASE_MARGIN_MS = 30_000
"""Added to the longest attempt to make a lease: covers recording Done, and clock skew."""
GRACE_MARGIN_S = 5.0
"""Added to the longest attempt to make the revocation grace: recording Done and publishing."""
EXPIRY_MARGIN_MS = 5_000
"""Kept free before an intent's expiry by every run: the result must still be recorded,
published and read by the worker before the intent expires (module docstring)."""
UNKNOWN_TOOL_WAIT_S = 60.0
"""How long an intent for a tool the registry lacks is held for a newer effector (a rolling
deploy's revocation) before it is answered REJECTED (module docstring)."""
WAIT_STEP_S = 1.0
"""An InFlight wait re-checks for a revocation this often."""

Headers = list[tuple[str, bytes]]


class EffectorIO(Protocol):
    """What the handler needs from Kafka (a Faust app in the effector, a fake in tests)."""

    async def publish(self, emit: Emit) -> None:
        """Hand one record to the producer."""
        ...

    async def reroute(self, *, key: bytes, value: bytes | None, partition: int, headers: Headers) -> None:
        """Hand a copy of an intent to the producer, for ``partition`` of agent.intents."""
        ...

    async def flush(self) -> None:
        """Wait until everything handed to the producer so far is acknowledged by Kafka."""
        ...


class Abandoned(asyncio.CancelledError):
    """A record left for the partitions' next owner: a revocation began before its attempt.

    A CancelledError, so the lanes release the record instead of acking it (as they do for
    a record cancelled after the grace period), and nothing was claimed or run."""


def attempt_s(spec: ToolSpec | None, default_timeout_s: float) -> float:
    """The longest one attempt at an intent can take: the tool's timeout, twice for a tool
    with a reconcile hook (reconcile, then the run it may allow)."""
    timeout_s = timeout_of(spec, default_timeout_s)
    return 2 * timeout_s if spec is not None and spec.reconcile is not None else timeout_s


def revocation_grace_s(specs: Iterable[ToolSpec], default_timeout_s: float) -> float:
    """How long a revocation must let a running attempt go on so it records Done and
    publishes before its partition is handed over: the longest attempt plus a margin."""
    longest = max((attempt_s(spec, default_timeout_s) for spec in specs if spec.side_effect), default=0.0)
    return max(longest, default_timeout_s) + GRACE_MARGIN_S


def _never() -> bool:
    return False


@dataclass(frozen=True)
class _Job:
    """What one intent's job read as it started: the owner epoch its claim writes carry, and
    whether the effector has stood still past its session timeout since (``run_watch``)."""

    epoch: int
    stood_still: Callable[[], bool]


class IntentHandler:
    """The effector's per-intent logic (module docstring), free of Faust."""

    def __init__(
        self,
        registry: ToolRegistry,
        claims: ClaimStore,
        io: EffectorIO,
        *,
        partitions: int,
        tool_timeout_s: float = 60.0,
        clock: Clock = wall_clock_ms,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        keyring: Keyring | None = None,
        intent_signatures: Mode = "off",
        revoking: Callable[[], bool] = _never,
        run_watch: Callable[[], Callable[[], bool]] = lambda: _never,
        epoch: Callable[[], int] = lambda: 0,
        result_limit: int | None = None,
        expiry_margin_ms: int = EXPIRY_MARGIN_MS,
        unknown_tool_wait_s: float = UNKNOWN_TOOL_WAIT_S,
    ) -> None:
        self.registry = registry
        self.unknown_tool_wait_s = unknown_tool_wait_s
        """How long an intent for an unknown tool is held before REJECTED (module docstring)."""
        self.expiry_margin_ms = expiry_margin_ms
        """How long before its expiry a run must be over (module docstring)."""
        self.result_limit = result_limit
        """The most bytes one encoded, signed result may take (None: no limit)."""
        self.claims = claims
        self.io = io
        self.partitions = partitions
        self.tool_timeout_s = tool_timeout_s
        self.clock = clock
        self.sleep = sleep
        self.keyring = keyring or Keyring({})
        self.intent_signatures = intent_signatures
        self.revoking = revoking
        self.run_watch = run_watch
        """Called as a job starts; what it returns says, whenever asked, whether the effector
        stood still past its session timeout since then (service/keylane/kafka/pauses.py)."""
        self.epoch = epoch
        """The effector's owner epoch now (its consumer group generation), read as a job starts:
        the claims it writes carry it (claims.py)."""

    async def handle(self, message: Any) -> None:
        """Steps 1-6 of the module docstring for one agent.intents record (a consumer
        message: topic, partition, offset, key, value, headers)."""
        job = _Job(self.epoch(), self.run_watch())  # read as the job starts: kafka/epochs.py
        key: bytes | None = message.key
        if key is not None:
            home = expected_partition(key, self.partitions)
            if home != message.partition:
                await self._reroute(message, home)
                return
        record = InputRecord.of(INTENTS, message)
        try:
            intent = decode(message.value, ToolIntent)
        except MalformedRecord as exc:
            await self.io.publish(error_emit(record, "malformed_record", exc.detail, now_ms=self.clock()))
            return
        if key != intent.entity_key.encode():
            detail = (
                f"record key {key!r} is not the intent's entity_key {intent.entity_key!r}; an intent "
                "is claimed in its key's partition, so the two must agree"
            )
            emit = error_emit(
                record, "malformed_record", detail, now_ms=self.clock(), intent_id=intent.intent_id
            )
            await self.io.publish(emit)
            return
        if self.intent_signatures != "off":
            verdict = self.keyring.verify(intent)
            if verdict != "ok":
                metrics.UNSIGNED.labels("intent").inc()
                if self.intent_signatures == "require":
                    detail = f"{verdict}: intent {intent.intent_id} for tool {intent.tool!r} not executed"
                    emit = error_emit(
                        record, "unsigned_intent", detail, now_ms=self.clock(), intent_id=intent.intent_id
                    )
                    await self.io.publish(emit)
                    return
                log.warning("intent %s is %s; executed (permissive mode)", intent.intent_id, verdict)
        await self._answer(intent, job)

    async def _answer(self, intent: ToolIntent, job: _Job) -> None:
        """Steps 4-6: claim, settle or run, record Done, publish."""
        runnable = check(intent, self.registry)
        spec = runnable.spec if isinstance(runnable, Runnable) else None
        lease_ms = int(attempt_s(spec, self.tool_timeout_s) * 1000) + LEASE_MARGIN_MS
        if self.registry.find(intent.tool) is None and not self.claims.answered(intent.intent_id):
            await self._hold_unknown(intent)
        while True:
            if self.revoking():
                raise Abandoned(f"intent {intent.intent_id}: partitions are being revoked")
            outcome = self.claims.claim(
                intent.intent_id,
                now_ms=self.clock(),
                lease_ms=lease_ms,
                expires_at_ms=intent.expires_at_ms,
                epoch=job.epoch,
            )
            if isinstance(outcome, Done):
                metrics.EFFECTOR_REPUBLISHED.inc()
                # Found in the local store, its changelog record may never have reached Kafka
                # (a kill -9 between the two): written again, so the next owner restores Done.
                await self._record(intent, outcome.result, job)
                await self._publish(intent, outcome.result)
                return
            if not isinstance(outcome, InFlight):
                break
            await self._wait_out(intent, outcome)
        if isinstance(outcome, Expired):
            await self._finish(
                intent, result_of(intent, "EXPIRED", error="intent expired before execution"), job
            )
            return
        if isinstance(runnable, ToolResult):
            await self._finish(intent, runnable, job)  # REJECTED: nothing can run
            return
        if isinstance(outcome, InDoubt):
            settled = await self._settle(intent, runnable.spec, outcome)
            if settled is not None:
                await self._finish(intent, settled, job)
                return
        await self.io.flush()  # the claim is durable before the side effect happens
        budget_ms = self._budget_ms(intent)
        if budget_ms <= 0:
            await self._finish(intent, result_of(intent, "EXPIRED", error=self._too_late(intent)), job)
            return
        if job.stood_still() or not self._still_in(job):
            # The job started before the effector stood still past its session timeout, or the
            # group left the generation it started in: the partition may have moved, and its
            # owner settles the claim. Checked against the job's start, not the run's: once the
            # consumer noticed its eviction it reads generation -1, which no pause fenced.
            raise Superseded(f"intent {intent.intent_id}")
        metrics.EFFECTOR_EXECUTIONS.inc()
        result = await run(intent, runnable, default_timeout_s=self.tool_timeout_s, budget_s=budget_ms / 1000)
        if job.stood_still():
            # The process stood still past its session timeout while the tool ran: a timeout
            # it reports is the pause's, and its partition may have moved. Nothing is recorded:
            # the claim's lease runs out and the next attempt settles the intent in doubt.
            log.warning(
                "intent %s: the effector stood still while tool %r ran; leaving it in doubt",
                intent.intent_id,
                intent.tool,
            )
            raise Superseded(f"intent {intent.intent_id}")
        await self._finish(intent, result, job)

    def _still_in(self, job: _Job) -> bool:
        """Whether the effector is still a member of the group generation ``job`` started in."""
        generation = self.epoch()
        return generation >= 0 and generation == job.epoch

    def _budget_ms(self, intent: ToolIntent) -> int:
        """How long a run may take and still be over ``expiry_margin_ms`` before the expiry."""
        return intent.expires_at_ms - self.expiry_margin_ms - self.clock()

    def _too_late(self, intent: ToolIntent) -> str:
        left_ms = intent.expires_at_ms - self.clock()
        if left_ms <= 0:
            return "intent expired before execution"
        return (
            f"intent expired before execution: {left_ms} ms were left, and a run must be over "
            f"{self.expiry_margin_ms} ms before the intent's expiry"
        )

    async def _hold_unknown(self, intent: ToolIntent) -> None:
        """Hold an intent whose tool this registry lacks, for a newer effector to take over
        (module docstring); raise Abandoned once a revocation begins."""
        until_ms = min(
            self.clock() + int(self.unknown_tool_wait_s * 1000), intent.expires_at_ms - self.expiry_margin_ms
        )
        if until_ms > self.clock():
            log.warning(
                "intent %s asks for tool %r, which this effector does not know: holding it up to "
                "%.0fs for an effector that does (a rolling deploy), then answering REJECTED",
                intent.intent_id,
                intent.tool,
                (until_ms - self.clock()) / 1000,
            )
        while True:
            if self.revoking():
                log.info("intent %s (unknown tool %r) left to the next owner", intent.intent_id, intent.tool)
                raise Abandoned(f"intent {intent.intent_id}: tool {intent.tool!r} left to the next owner")
            remaining_s = (until_ms - self.clock()) / 1000
            if remaining_s <= 0:
                return
            await self.sleep(min(WAIT_STEP_S, remaining_s))

    async def _wait_out(self, intent: ToolIntent, held: InFlight) -> None:
        """Sleep until the holder's lease is over, or a revocation begins."""
        log.warning(
            "intent %s is held by an earlier attempt until %s; waiting", intent.intent_id, held.lease_until_ms
        )
        while not self.revoking():
            remaining_s = (held.lease_until_ms - self.clock()) / 1000
            if remaining_s <= 0:
                return
            await self.sleep(min(WAIT_STEP_S, remaining_s))

    async def _settle(self, intent: ToolIntent, spec: ToolSpec, doubt: InDoubt) -> ToolResult | None:
        """An in-doubt intent's answer, or None when it must run now (reconcile says it did
        not happen, or the tool's policy is "rerun"; an expired intent is then refused by the
        caller). Without a hook an expired intent is EXPIRED, never run."""
        earlier = f"an attempt claimed at {doubt.claimed_at_ms} ms ended without recording an outcome"
        if spec.reconcile is None and self._budget_ms(intent) <= 0:
            # Too late to run it, whatever the policy; only a hook could tell whether it happened.
            metrics.EFFECTOR_IN_DOUBT.labels("expired").inc()
            log.warning(
                "intent %s is in doubt (%s) and expired: answering EXPIRED", intent.intent_id, earlier
            )
            error = f"{self._too_late(intent)}; in doubt: {earlier} and may have taken effect"
            return result_of(intent, "EXPIRED", error=error)
        if spec.reconcile is not None:
            timeout_s = timeout_of(spec, self.tool_timeout_s)
            try:
                value = await asyncio.wait_for(spec.reconciled(intent.intent_id), timeout_s)
            except TimeoutError:
                why = f"reconcile timed out after {timeout_s}s"
                return self._in_doubt_error(intent, f"in doubt: {earlier}; {why}")
            except Exception as exc:  # noqa: BLE001 - a failing hook settles as ERROR, never crashes the lane
                why = f"reconcile raised {type(exc).__name__}: {exc}"
                return self._in_doubt_error(intent, f"in doubt: {earlier}; {why}")
            if value is None:
                metrics.EFFECTOR_IN_DOUBT.labels("reconciled_not_done").inc()
                log.info(
                    "intent %s was in doubt; reconcile says it never happened: running it", intent.intent_id
                )
                return None
            result = ok_result(intent, value, what="in doubt: reconcile result")
            metrics.EFFECTOR_IN_DOUBT.labels("reconciled_done" if result.status == "OK" else "error").inc()
            log.info("intent %s was in doubt; reconcile returned its earlier result", intent.intent_id)
            return result
        if spec.in_doubt == "rerun":
            metrics.EFFECTOR_IN_DOUBT.labels("rerun").inc()
            log.warning(
                "intent %s is in doubt (%s); running it again (in_doubt='rerun')", intent.intent_id, earlier
            )
            return None
        return self._in_doubt_error(
            intent,
            f"in doubt: {earlier}; tool {intent.tool!r} may have taken effect and is not run again "
            "(in_doubt='error'; declare reconcile= to find out what happened)",
        )

    def _in_doubt_error(self, intent: ToolIntent, error: str) -> ToolResult:
        metrics.EFFECTOR_IN_DOUBT.labels("error").inc()
        log.warning("intent %s: %s", intent.intent_id, error)
        return result_of(intent, "ERROR", error=error)

    async def _finish(self, intent: ToolIntent, result: ToolResult, job: _Job) -> None:
        """Sign, record Done (the bytes every redelivery republishes), publish."""
        encoded = encode(self.keyring.sign(result))
        if self.result_limit is not None and len(encoded) > self.result_limit:
            error = (
                f"tool {intent.tool!r} returned a {result.status} result of {len(encoded)} bytes, over "
                f"the {self.result_limit}-byte limit of a result record; it ran, and its result was "
                "not kept (return less, or raise max_message_bytes of agent.results in "
                "topics/catalog.toml)"
            )
            log.warning("intent %s: %s", intent.intent_id, error)
            result = result_of(intent, "ERROR", error=error)
            encoded = encode(self.keyring.sign(result))
        await self._record(intent, encoded, job)
        await self._publish(intent, encoded)
        metrics.EFFECTOR_INTENTS.labels(result.status).inc()

    async def _record(self, intent: ToolIntent, result: bytes, job: _Job) -> None:
        """Write Done and wait until Kafka has its changelog record: a result reaches
        agent.results only once its Done survives the loss of this effector's volume.

        Superseded, and nothing published, when the effector stood still past its session
        timeout since the job started: its partition may have moved, and the next owner
        answers the intent from what it restores (this Done, or the claim, in doubt), so
        the intent never gets two different answers."""
        self.claims.complete(intent.intent_id, result, now_ms=self.clock(), epoch=job.epoch)
        await self.io.flush()
        if job.stood_still():
            log.warning(
                "intent %s: the effector stood still while its Done was on its way; not publishing "
                "its result (the partition's owner answers it)",
                intent.intent_id,
            )
            raise Superseded(f"intent {intent.intent_id}")

    async def _publish(self, intent: ToolIntent, result: bytes) -> None:
        await self.io.publish(
            Emit(record_id=intent.intent_id, topic=RESULTS, key=intent.entity_key.encode(), value=result)
        )

    async def _reroute(self, message: Any, partition: int) -> None:
        metrics.RECORDS_REROUTED.labels(INTENTS).inc()
        log.info(
            "intent record %s/%s/%s is on the wrong partition for its key; re-producing it to %s",
            message.topic,
            message.partition,
            message.offset,
            partition,
        )
        kept = [(name, value) for name, value in _header_items(message.headers) if name != ORIGIN_HEADER]
        await self.io.reroute(
            key=message.key, value=message.value, partition=partition, headers=[*kept, origin_header(message)]
        )


def _header_items(headers: Any) -> list[tuple[str, bytes]]:
    """A consumed record's headers as pairs (aiokafka gives a sequence, some clients a mapping)."""
    if not headers:
        return []
    return list(headers.items() if hasattr(headers, "items") else headers)
