"""Tenant shards: one plan, three isolated shards, each recovering on its own.

Six tenants live on three shards. Every tenant runs the pipeline extract -> transform ->
load; every step is one activation of the shard's physical key, and the shard's state is its
journal of finished steps. Each shard is its own deployment here (its own worker process,
consumer group and topics), with its own provider rate limit.

Run 1 kills shard_2's worker for real (SIGKILL) when it reaches umbrella:transform. Run 2 is
issued to every shard without knowing which one failed. On restart, Kafka redelivers the step
shard_2 never committed, and each shard's journal decides what the rerun means: finished
steps are skipped, the rest run.

    python examples/tenant_shards.py     # uses KAFKA_BOOTSTRAP_SERVERS, else starts a local Kafka

Run as a keylane agent by the worker processes it starts:
    keylane worker --agent examples.tenant_shards:run_step
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from keylane import (
    ActivationContext,
    AgentConfig,
    Complete,
    FakeLLM,
    LlmRequest,
    RateLimit,
    match_any,
    respond_with,
)
from keylane.catalog import EVENTS, OUTPUT, load_catalog
from keylane.config import Settings
from keylane.kafka.producer import produce_in_order
from keylane.kafka.topic_admin import admin_client, apply_catalog
from keylane.kafka.topic_reader import read_to_end
from keylane.testing.processes import KeylaneProcess, settings_env
from keylane.wire import AgentEnvelope, encode

SHARDS = {
    "shard_1": ["acme", "globex"],
    "shard_2": ["initech", "umbrella", "hooli"],
    "shard_3": ["wonka"],
}
PIPELINE = ["extract", "transform", "load"]
# The control plane's schedule: each tenant's steps in pipeline order, tenants interleaved.
PLAN = {
    "shard_1": [f"{t}:{s}" for t in SHARDS["shard_1"] for s in PIPELINE],
    "shard_2": [
        "initech:extract",
        "umbrella:extract",
        "initech:transform",
        "hooli:extract",
        "initech:load",
        "hooli:transform",
        "hooli:load",
        "umbrella:transform",
        "umbrella:load",
    ],
    "shard_3": [f"{t}:{s}" for t in SHARDS["shard_3"] for s in PIPELINE],
}
CRASH = ("shard_2", "umbrella:transform")
REPO = Path(__file__).resolve().parent.parent


# --- the agent: one pipeline step per activation, journaled in the shard's state -------------


def make_provider() -> FakeLLM:
    return FakeLLM([(match_any(), respond_with(b"done", latency_ms=2))], keep_requests=False)


# Each shard's worker: 20 provider calls/s for its key, 50/s for the worker. A hot shard would
# wait on its own bucket; it cannot spend another shard's budget.
config = AgentConfig(
    provider_factory=make_provider, rate_limit=RateLimit(per_key_per_s=20, per_key_burst=2, global_per_s=50)
)


async def run_step(ctx: ActivationContext) -> Complete:
    """Skip a step the journal already holds; otherwise do it and journal it under this run."""
    request = json.loads(ctx.event)
    step, run = request["step"], int(os.environ.get("RUN_ID", request["run"]))
    journal: dict[str, int] = ctx.memory.get("journal") or {}
    if step in journal:
        answer = {
            "step": step,
            "status": "skipped",
            "journaled_in_run": journal[step],
            "event_run": request["run"],
        }
        return Complete(output=json.dumps(answer).encode())
    if os.environ.get("CRASH_AT") == step:
        # The power goes a second into this step: the steps before it have reached Kafka,
        # nothing of this one is committed.
        await asyncio.sleep(1)
        os.kill(os.getpid(), signal.SIGKILL)
    await ctx.call_model(LlmRequest(model_id="step-runner", messages=[step]))
    ctx.memory.set("journal", {**journal, step: run})
    answer = {"step": step, "status": "ran", "journaled_in_run": run, "event_run": request["run"]}
    return Complete(output=json.dumps(answer).encode())


# --- the control plane -----------------------------------------------------------------------


@dataclass
class ShardRun:
    """What one run did on one shard."""

    shard: str
    status: str = "completed"
    ran: int = 0
    skipped: int = 0
    crashed_at: str | None = None


class Shard:
    """One shard's deployment: its topics, its consumer group, its data dir, its worker."""

    def __init__(self, name: str, bootstrap: str, base: Path, prefix: str) -> None:
        self.name = name
        self.settings = Settings.from_env(
            {},
            bootstrap_servers=bootstrap,
            topic_prefix=f"{prefix}{name}.",
            app_id=f"{prefix}{name}",
            data_dir=base / name,
            metrics_port=0,
            session_timeout_s=6,
        )
        self.catalog = load_catalog(prefix=self.settings.topic_prefix)
        self.log = base / f"{name}.log"
        self.worker: KeylaneProcess | None = None

    async def create_topics(self) -> None:
        async with admin_client(self.settings) as client:
            await apply_catalog(client, self.catalog)

    def start(self, run: int) -> None:
        """Start the shard's worker (appending to its log) and wait until it is ready."""
        env = {**os.environ, **settings_env(self.settings), "RUN_ID": str(run)}
        if run == 1 and self.name == CRASH[0]:
            env["CRASH_AT"] = CRASH[1]
        args = ["worker", "--agent", "examples.tenant_shards:run_step"]
        self.worker = KeylaneProcess(args, env, self.log, name=f"the worker of {self.name}", cwd=REPO)
        self.worker.start()

    @property
    def alive(self) -> bool:
        return self.worker is not None and self.worker.running

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()

    async def issue(self, run: int) -> None:
        values = [
            encode(AgentEnvelope(payload=json.dumps({"run": run, "step": step}))) for step in PLAN[self.name]
        ]
        await produce_in_order(
            self.settings, self.catalog.name(EVENTS), [(self.name.encode(), v) for v in values]
        )

    async def answers(self, run: int) -> dict[str, dict[str, object]]:
        """This run's outputs by step (the answer to each step this run issued)."""
        answers: dict[str, dict[str, object]] = {}
        for record in await read_to_end(self.settings, self.catalog.name(OUTPUT)):
            answer = json.loads(record.value or b"{}")
            if answer.get("event_run") == run:
                answers[answer["step"]] = answer
        return answers


async def run_once(shards: list[Shard], run: int) -> list[ShardRun]:
    """Issue the whole plan to every shard; wait until each shard answered every step or died."""
    for shard in shards:
        shard.start(run)
    for shard in shards:
        await shard.issue(run)
    results = []
    for shard in shards:
        deadline = time.monotonic() + 120
        while True:
            answers = await shard.answers(run)
            if len(answers) == len(PLAN[shard.name]) or not shard.alive:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{shard.name} did not finish run {run}; see {shard.log}")
            await asyncio.sleep(0.2)
        ran = sum(1 for a in answers.values() if a["journaled_in_run"] == run)
        if shard.alive:
            results.append(ShardRun(shard.name, ran=ran, skipped=len(PLAN[shard.name]) - ran))
        else:
            crashed_at = PLAN[shard.name][len(answers)]
            results.append(ShardRun(shard.name, status="partial_failure", ran=ran, crashed_at=crashed_at))
    for shard in shards:
        shard.stop()
    return results


async def main(bootstrap: str) -> None:
    prefix = f"tenants-{uuid.uuid4().hex[:8]}."
    with tempfile.TemporaryDirectory(prefix="tenant-shards-") as tmp:
        shards = [Shard(name, bootstrap, Path(tmp), prefix) for name in SHARDS]
        for shard in shards:
            await shard.create_topics()
        tenants = sum(len(t) for t in SHARDS.values())
        print(f"TENANT SHARDS ({len(SHARDS)} shards, {tenants} tenants, pipeline: {' -> '.join(PIPELINE)})")
        print()
        print(f"  run 1 - {CRASH[0]} loses power mid-tenant:")
        for result in await run_once(shards, 1):
            crash = f"  <- crashed at {result.crashed_at}" if result.crashed_at else ""
            print(f"    {result.shard:<9} {result.status:<16} {result.ran:>2} steps ran{crash}")
        print()
        print("  run 2 - control plane reruns everything; journals decide what that means:")
        for result in await run_once(shards, 2):
            print(
                f"    {result.shard:<9} {result.status:<16} {result.ran:>2} steps ran, "
                f"{result.skipped:>2} skipped (already journaled)"
            )
        print()
        print("  Run 2 went to every shard: the control plane does not know which one failed.")
        print("  Shards 1 and 3 found every step in their journals. Shard 2 got the step it never")
        print("  committed back from Kafka on restart and ran only what its journal lacked.")


def bootstrap_or_local() -> tuple[str, object | None]:
    """KAFKA_BOOTSTRAP_SERVERS, else a local Kafka from deploy/kafka (stopped at exit)."""
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or os.environ.get("KEYLANE_BOOTSTRAP_SERVERS")
    if bootstrap:
        return bootstrap, None
    sys.path.insert(0, str(REPO / "deploy" / "kafka"))
    import local_kafka

    state = Path(tempfile.mkdtemp(prefix="tenant-shards-kafka-"))
    return local_kafka.start(state, quiet=True).bootstrap, lambda: local_kafka.stop(state, quiet=True)


if __name__ == "__main__":
    address, stop_kafka = bootstrap_or_local()
    try:
        asyncio.run(main(address))
    finally:
        if callable(stop_kafka):
            stop_kafka()
