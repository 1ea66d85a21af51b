"""The effector on Faust: agent.intents -> execute once -> agent.results.

Per intent, in order (partitions run in parallel, one intent at a time per partition):

1. decode it; a bad record becomes ``malformed_record`` on agent.errors; under
   ``KEYLANE_INTENT_SIGNATURES=require`` an unsigned or badly signed intent becomes
   ``unsigned_intent`` and its tool never runs;
2. refuse it when expired (``expires_at_ms`` at or before now): publish status EXPIRED
   without touching the dedup store;
3. claim it (see claims.py): Done republishes the stored result, InFlight waits for the
   holder's lease, Claimed goes on;
4. make the claim durable (flush), then execute the tool with its timeout;
5. record Done with the result, publish the ToolResult keyed by the intent's physical key;
6. ack. Faust flushes the producer before committing the offset, so the offset is
   committed only after the result was published.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import faust

from service import metrics
from service.catalog import INTENTS, RESULTS, Catalog
from service.effector.claims import ClaimStore, Done, InFlight
from service.effector.execute import execute, result_of
from service.records import Emit, InputRecord, error_emit
from service.runtime.activation import Clock, wall_clock_ms
from service.runtime.faust_glue import feed_lanes, guard_offsets
from service.runtime.lanes import PartitionLanes
from service.runtime.processor import Publisher, raw_topic
from service.signing import Keyring, Mode
from service.tools import ToolRegistry
from service.wire import MalformedRecord, ToolIntent, ToolResult, decode, encode

log = logging.getLogger(__name__)

CLAIMS_TABLE = "effector-claims"
LEASE_MARGIN_MS = 30_000


class Effector:
    """Installs the effector's Faust agent and claim table on an app."""

    def __init__(
        self,
        app: faust.App,
        catalog: Catalog,
        registry: ToolRegistry,
        *,
        tool_timeout_s: float = 60.0,
        clock: Clock = wall_clock_ms,
        keyring: Keyring | None = None,
        intent_signatures: Mode = "off",
    ) -> None:
        self.keyring = keyring or Keyring({})
        self.intent_signatures = intent_signatures
        self.app = app
        self.catalog = catalog
        self.registry = registry
        self.tool_timeout_s = tool_timeout_s
        self.clock = clock
        self.lanes = PartitionLanes()
        self.publisher = Publisher(app, catalog)
        source = raw_topic(app, catalog.name(INTENTS))
        self.table = app.Table(
            CLAIMS_TABLE,
            default=None,
            partitions=catalog[INTENTS].partitions,
            key_type=bytes,
            value_type=bytes,
        )
        self.claims = ClaimStore(self.table)
        self.offsets = guard_offsets(app, [catalog.name(INTENTS)])
        app.agent(source, name="keylane.effector")(self._consume)
        app.on_before_shutdown.connect(self._stop_lanes)  # type: ignore[arg-type]  # see processor.py

    async def _consume(self, stream: Any) -> None:
        await feed_lanes(stream, self.lanes, self._handle_event)

    async def _handle_event(self, event: Any) -> None:
        await self.handle(event.message)

    async def _stop_lanes(self, sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        await self.lanes.stop()
        await self.offsets.close()

    async def handle(self, message: Any) -> None:
        """Steps 1-5 of the module docstring for one agent.intents record."""
        record = InputRecord.of(INTENTS, message)
        try:
            intent = decode(message.value, ToolIntent)
        except MalformedRecord as exc:
            await self.publisher.publish(
                error_emit(record, "malformed_record", exc.detail, now_ms=self.clock())
            )
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
                    await self.publisher.publish(emit)
                    return
                log.warning("intent %s is %s; executed (permissive mode)", intent.intent_id, verdict)
        if intent.expires_at_ms <= self.clock():
            await self._publish(intent, result_of(intent, "EXPIRED", error="intent expired before execution"))
            return
        lease_ms = int(self.tool_timeout_s * 1000) + LEASE_MARGIN_MS
        while True:
            outcome = self.claims.claim(intent.intent_id, now_ms=self.clock(), lease_ms=lease_ms)
            if isinstance(outcome, Done):
                metrics.EFFECTOR_REPUBLISHED.inc()
                await self._publish_raw(intent, outcome.result)
                return
            if isinstance(outcome, InFlight):
                wait_s = max(0.25, (outcome.lease_until_ms - self.clock()) / 1000)
                log.warning(
                    "intent %s is held by an earlier attempt; waiting %.1fs", intent.intent_id, wait_s
                )
                await asyncio.sleep(wait_s)
                continue
            break
        await self.app.producer.flush()  # the claim is durable before the side effect happens
        metrics.EFFECTOR_EXECUTIONS.inc()
        result = await execute(intent, self.registry, default_timeout_s=self.tool_timeout_s)
        encoded = encode(result)
        self.claims.complete(intent.intent_id, encoded, now_ms=self.clock())
        await self._publish_raw(intent, encoded, status=result.status)

    async def _publish(self, intent: ToolIntent, result: ToolResult) -> None:
        await self._publish_raw(intent, encode(result), status=result.status)

    async def _publish_raw(self, intent: ToolIntent, result: bytes, *, status: str | None = None) -> None:
        await self.publisher.publish(
            Emit(record_id=intent.intent_id, topic=RESULTS, key=intent.entity_key.encode(), value=result)
        )
        if status is not None:
            metrics.EFFECTOR_INTENTS.labels(status).inc()
