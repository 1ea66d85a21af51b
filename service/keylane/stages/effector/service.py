"""The effector on Faust: agent.intents -> execute once -> agent.results.

Partitions run in parallel, one intent at a time per partition (``PartitionLanes``); what
each intent goes through is in handler.py. What this module adds is the Faust side, and
the one rule that keeps a rebalance from ever running a tool twice:

**A revocation lets every running attempt finish.** The claim table lives in Faust tables
whose changelog the next owner restores; an attempt cancelled mid-tool (the lanes cancel
work after their grace period, and a cancelled ``asyncio.to_thread`` keeps running) would
leave a claim without Done, and the next owner would wait out the lease and face the
intent in doubt. So the effector's revocation grace is its longest attempt (the longest
tool timeout, twice for a tool with a reconcile hook) plus a margin, not the worker's 10 s:
a running tool finishes within its timeout, records Done and hands its result to the
producer; Faust then flushes the producer and commits before this member rejoins the
group, and the next owner restores a changelog that already holds Done. No attempt starts
once a revocation has begun (handler.py), so the grace covers whatever is running. For the
group to wait that long, the consumer's rebalance timeout (and the request timeout its
JoinGroup waits under) are raised above the grace period.

**A claim from a former owner never replaces its successor's.** An effector that stood still
past its session timeout keeps its producer: a claim it had on its way lands after the
next owner's records. The claims table carries owner epochs and is restored through an
``EpochFence`` (service/keylane/kafka/epochs.py), which skips such a late claim; once the
recovery after a rebalance is done, the effector writes again each key whose last changelog
record was skipped (``HEAL_INTERVAL_S`` checks for it), so compaction keeps the owner's.

The alternative — letting the next owner see the outcome through the lease alone — cannot
work: the outcome of a cancelled attempt is unknowable to anyone but the tool's own system,
which is what ``reconcile`` is for (the crash window, docs/effector.md). The price of the
rule: an effector rebalance may take up to the longest tool timeout while a tool runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from keylane import metrics
from keylane.authoring.tools import ToolRegistry
from keylane.catalog import INTENTS, RESULTS, Catalog
from keylane.clock import Clock, wall_clock_ms
from keylane.core.lanes import PartitionLanes
from keylane.kafka.app import (
    App,
    changelog_record_limit,
    on_rebalance_complete,
    on_shutdown,
    recovery_completed,
)
from keylane.kafka.delivery import RecordTooLarge, confirm_handed_off, confirming, track_changelog
from keylane.kafka.epochs import EpochFence, group_generation, owns_partition, request_rejoin
from keylane.kafka.lane_feed import lane_agent
from keylane.kafka.offset_guard import guard_offsets
from keylane.kafka.pauses import PauseWatch
from keylane.kafka.publish import Publisher, raw_topic
from keylane.kafka.restore_start import RestoreStart
from keylane.records import Emit, InputRecord, error_emit
from keylane.signing import Keyring, Mode
from keylane.stages.effector.claims import ClaimStore, claim_epoch_of
from keylane.stages.effector.handler import (
    RESULT_RECORD_MARGIN_BYTES,
    UNKNOWN_TOOL_WAIT_S,
    EffectorIO,
    Headers,
    IntentHandler,
    revocation_grace_s,
)

log = logging.getLogger(__name__)

HEAL_INTERVAL_S = 1.0
"""How often the effector checks whether a rebalance's recovery is done, to rewrite the claims
whose last changelog record was a former owner's late write."""

CLAIMS_TABLE = "effector-claims"
REBALANCE_MARGIN_S = 15.0
"""How much longer than the grace period the group waits for a member to rejoin."""
FAUST_REBALANCE_TIMEOUT_S = 60.0
FAUST_REQUEST_TIMEOUT_S = 90.0


class EffectorLanes(PartitionLanes):
    """PartitionLanes that say whether a revocation is under way (``revoking``)."""

    revoking: bool = False

    async def revoke(self, grace_s: float) -> int:
        self.revoking = True
        return await super().revoke(grace_s)

    def resume(self) -> None:
        self.revoking = False
        super().resume()


class FaustEffectorIO(EffectorIO):
    """The handler's Kafka side on a Faust app: publishes through ``Publisher``, re-routes
    to agent.intents, flushes the app's producer. Every record it hands over, and every claim
    table write, is confirmed by Kafka before the intent's job ends (``Effector.handle`` runs
    in ``confirming``), so an intent's offset is never committed before its Done, its result
    or its copy is in Kafka (service/keylane/kafka/delivery.py)."""

    def __init__(self, app: App, publisher: Publisher, intents: Any) -> None:
        self._app = app
        self._publisher = publisher
        self._intents = intents

    async def publish(self, emit: Emit) -> None:
        await self._publisher.publish(emit)

    async def reroute(self, *, key: bytes, value: bytes | None, partition: int, headers: Headers) -> None:
        try:
            await self._intents.send(key=key, value=value, partition=partition, headers=headers)
        except RecordTooLarge as refused:  # the copy's origin header took it over the limit
            await self._publisher.refuse(refused)

    async def flush(self) -> None:
        """Flush, then wait for Kafka to confirm what this intent produced so far: its claim
        is durable before the tool runs, and a refused claim stops the effector first."""
        await self._app.producer.flush()
        await confirm_handed_off()


class Effector:
    """Installs the effector's Faust agent and claim table on an app, and sets the app's
    revocation grace and group timeouts so a rebalance never re-runs a tool (module
    docstring). Tools must be registered before it is built: the grace is computed from
    the registry then."""

    def __init__(
        self,
        app: App,
        catalog: Catalog,
        registry: ToolRegistry,
        *,
        tool_timeout_s: float = 60.0,
        clock: Clock = wall_clock_ms,
        keyring: Keyring | None = None,
        intent_signatures: Mode = "off",
        unknown_tool_wait_s: float = UNKNOWN_TOOL_WAIT_S,
    ) -> None:
        self.app = app
        self.catalog = catalog
        self.registry = registry
        self.lanes = EffectorLanes()
        self.pauses = PauseWatch(
            float(app.conf.broker_session_timeout),
            generation=partial(group_generation, app),
            on_pause=partial(request_rejoin, app),
        ).start()
        self._stopping: asyncio.Future[int] | None = None
        self.publisher = Publisher(app, catalog)
        source = raw_topic(app, catalog.name(INTENTS))
        self.table = app.Table(
            CLAIMS_TABLE,
            default=None,
            partitions=catalog[INTENTS].partitions,
            key_type=bytes,
            value_type=bytes,
        )
        track_changelog(self.table)  # a claim counts as written only once Kafka has it
        # a restore never takes a former owner's late claim over its successor's
        self.fence = EpochFence(self.table, claim_epoch_of, owns=owns_partition(app, catalog.name(INTENTS)))
        self.fence.install()
        self._heal_pending = False
        # a restore never starts past claims another effector wrote while this one was away
        RestoreStart(self.table, app).install()
        self.claims = ClaimStore(self.table)
        self.handler = IntentHandler(
            registry,
            self.claims,
            FaustEffectorIO(app, self.publisher, raw_topic(app, catalog.name(INTENTS))),
            partitions=catalog[INTENTS].partitions,
            tool_timeout_s=tool_timeout_s,
            clock=clock,
            keyring=keyring,
            intent_signatures=intent_signatures,
            revoking=self._revoking,
            run_watch=self._run_watch,
            epoch=partial(group_generation, app),
            result_limit=min(changelog_record_limit(app, catalog), catalog[RESULTS].max_message_bytes)
            - RESULT_RECORD_MARGIN_BYTES,
            unknown_tool_wait_s=unknown_tool_wait_s,
        )
        self.offsets = guard_offsets(app, [catalog.name(INTENTS)])
        metrics.zero(metrics.RECORDS_REROUTED, [INTENTS])
        self.grace_s = revocation_grace_s(registry.specs(), tool_timeout_s)
        self.offsets.grace_s = max(self.offsets.grace_s, self.grace_s)
        # Set, never read first: Faust warns when a setting it already handed out changes.
        rebalance_timeout_s = max(FAUST_REBALANCE_TIMEOUT_S, self.grace_s + REBALANCE_MARGIN_S)
        app.conf.broker_rebalance_timeout = rebalance_timeout_s
        app.conf.broker_request_timeout = max(
            FAUST_REQUEST_TIMEOUT_S, rebalance_timeout_s + REBALANCE_MARGIN_S
        )
        log.info(
            "effector revocation grace %.0fs, rebalance timeout %.0fs (longest tool attempt + margins)",
            self.grace_s,
            rebalance_timeout_s,
        )
        lane_agent(
            app,
            source,
            name="keylane.effector",
            lanes=self.lanes,
            handle=self._handle_event,
            on_poison=self._dead_letter,
        )
        on_shutdown(app, self._stop_lanes)
        on_rebalance_complete(app, self._on_rebalance_complete)
        app.timer(HEAL_INTERVAL_S, name="keylane.effector-heal")(self.heal_after_recovery)

    async def _on_rebalance_complete(self) -> None:
        self._heal_pending = True

    async def heal_after_recovery(self) -> None:
        """Once the recovery after a rebalance is done, write again the claims whose last
        changelog record is a former owner's late write (``EpochFence.heal``)."""
        if not self._heal_pending or not recovery_completed(self.app):
            return
        self._heal_pending = False
        healed = self.fence.heal()
        if healed:
            log.warning("rewrote %s claims whose last changelog record was a former owner's", healed)

    def _run_watch(self) -> Callable[[], bool]:
        """For a job starting now: whether the effector stood still past its session timeout
        since, or the job started under a generation held before such a pause."""
        started, epoch = time.monotonic(), group_generation(self.app)
        return partial(self.pauses.interrupted, started, epoch)

    def _revoking(self) -> bool:
        """Whether a revocation is under way, a stop counting as one: Faust's stop waits for
        every record in progress before it revokes anything, so once the app is stopping
        the first check starts revoking the lanes itself. A held record (an unknown tool,
        handler.py) or one waiting on a lease is then left, uncommitted, to the next owner,
        and running attempts get the revocation grace, as in a rebalance."""
        if self.app.should_stop and not self.lanes.revoking and self._stopping is None:
            self._stopping = asyncio.ensure_future(self.lanes.revoke(self.grace_s))
        return self.lanes.revoking

    async def _dead_letter(self, event: Any, exc: Exception) -> None:
        """An intent whose handling kept raising: a dead letter replaces it, the partition
        moves on, and its tool never ran past a Done it could not record."""
        record = InputRecord.of(INTENTS, event.message)
        detail = f"{type(exc).__name__}: {exc}"
        async with confirming(self.app):
            await self.publisher.publish(
                error_emit(record, "processing_failed", detail, now_ms=wall_clock_ms())
            )

    async def _handle_event(self, event: Any) -> None:
        async with confirming(self.app):  # the job ends once Kafka has what it produced
            await self.handle(event.message)

    async def _stop_lanes(self) -> None:
        await self.lanes.stop()
        await self.offsets.close()
        self.pauses.stop()

    async def handle(self, message: Any) -> None:
        """One agent.intents record (handler.py's steps)."""
        await self.handler.handle(message)
