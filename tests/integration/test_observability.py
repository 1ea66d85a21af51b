"""The operators' view, end to end: a worker and an effector on a real broker, scraped by a real
Prometheus (Debian's /usr/bin/prometheus) with deploy/prometheus/rules loaded, fed a mixed
stream: events that complete, events that wait on a tool or on an approval (some answered, one
left waiting, one timing out), a burst that pauses its partition, a record that does not decode
and an approval nobody waits for (both dead letters). Then, read through Prometheus:

* every panel query of every dashboard in deploy/grafana/dashboards/, Grafana's variables
  substituted, returns data, and so does every template variable's query;
* the metric identities hold against the records on the topics;
* every alert and recording rule group loads and evaluates healthy.

Without a Grafana server this is how the dashboards are checked against live data (their JSON
is checked against the Grafana Foundation SDK's models in tests/deploy/test_dashboards.py).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from keylane.approvals import send_approval
from keylane.catalog import APPROVAL_REQUESTS, ERRORS, EVENTS, INTENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import read_to_end
from keylane.testing.processes import free_port
from keylane.wire import AgentEnvelope, ApprovalRequest, ErrorRecord, decode, encode
from tests.kafka_io import produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running
from tests.prometheus import (
    DASHBOARDS,
    GrafanaVariables,
    Prometheus,
    panel_queries,
    running_prometheus,
    variable_queries,
)

pytestmark = pytest.mark.kafka

WORKER_JOB = "keylane-worker"
EFFECTOR_JOB = "keylane-effector"
AGENT = "tests.agents.observed"

ORDERS = [(b"order-1", "o-1"), (b"order-2", "o-2a"), (b"order-2", "o-2b"), (b"order-3", "o-3")]
ASKS = [b"ask-approve", b"ask-deny", b"ask-waiting"]
LATE = [b"late-1"]
BURST = [(b"burst-1", f"burst-{i}") for i in range(40)]
# Each order and burst event, the two answered asks and the late one (denied by its timer).
EXPECTED_OUTPUTS = len(ORDERS) + len(BURST) + 2 + len(LATE)


async def produce_the_mixed_stream(settings: Settings, catalog: Catalog) -> None:
    events = [
        *((key, encode(AgentEnvelope(payload=text))) for key, text in ORDERS),
        *((key, encode(AgentEnvelope(payload=key.decode()))) for key in ASKS + LATE),
        (b"bad-1", b"this is not a keylane envelope"),  # malformed_record
        *((key, encode(AgentEnvelope(payload=text))) for key, text in BURST),
    ]
    await produce(settings, catalog.name(EVENTS), events)
    requests = await wait_for_records(
        settings, catalog.name(APPROVAL_REQUESTS), lambda rs: len(rs) >= len(ASKS) + len(LATE), timeout_s=60
    )
    by_key = {r.entity_key: r for r in (decode(x.value, ApprovalRequest) for x in requests)}
    for key, approved in (("ask-approve", True), ("ask-deny", False)):
        await send_approval(
            settings,
            catalog,
            key=key,
            intent_id=by_key[key].intent_id,
            approved=approved,
            approver="ops",
            reason=None,
        )
    # An approval no continuation waits for: orphaned_result on agent.errors.
    await send_approval(
        settings,
        catalog,
        key="nobody-1",
        intent_id=str(uuid.uuid4()),
        approved=True,
        approver="ops",
        reason=None,
    )


async def eventually(check: Callable[[], Awaitable[list[str]]], timeout_s: float) -> list[str]:
    """Run ``check`` until it finds no problem or ``timeout_s`` passed; its last problems."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        problems = await check()
        if not problems or asyncio.get_running_loop().time() > deadline:
            return problems
        await asyncio.sleep(1)


def identity_check(
    prometheus: Prometheus, settings: Settings, catalog: Catalog
) -> Callable[[], Awaitable[list[str]]]:
    """The identities of service/keylane/metrics.py and docs/runtime.md, as Prometheus sums them
    over every worker and effector, against the records on the topics."""
    identities = {
        INTENTS: ["sum(keylane_intents_emitted_total)"],
        ERRORS: ["sum(keylane_agent_errors_total)", "sum(keylane_orphaned_results_total)"],
        OUTPUT: ["sum(keylane_outputs_total)"],
    }

    async def check() -> list[str]:
        problems = []
        for topic, exprs in identities.items():
            records = len(await read_to_end(settings, catalog.name(topic)))
            values = {expr: prometheus.value(expr) for expr in exprs}
            missing = [expr for expr, value in values.items() if value is None]
            if missing:
                problems.append(
                    f"{' + '.join(exprs)} == records on {topic} ({records}): no data for {missing}"
                )
            elif sum(v for v in values.values() if v is not None) != records:
                problems.append(f"{' + '.join(exprs)} == records on {topic}: {values} vs {records} records")
        return problems

    return check


@pytest.mark.timeout(360)
async def test_dashboards_identities_and_rules_on_a_real_prometheus(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    worker_port, effector_port = free_port(), free_port()
    env = process_env(settings, KEYLANE_METRICS_PORT=str(worker_port))
    worker = KeylaneProcess(["worker", "--agent", f"{AGENT}:agent"], env, tmp_path / "worker.log")
    effector = KeylaneProcess(
        ["effector", "--tools", AGENT, "--metrics-port", str(effector_port)], env, tmp_path / "effector.log"
    )
    targets = {WORKER_JOB: [f"127.0.0.1:{worker_port}"], EFFECTOR_JOB: [f"127.0.0.1:{effector_port}"]}
    variables = GrafanaVariables(prefix=settings.topic_prefix)

    with running_prometheus(targets, tmp_path / "prometheus") as prometheus, running(worker, effector):
        prometheus.wait_targets_up(targets)
        await produce_the_mixed_stream(settings, catalog)
        outputs = await wait_for_records(
            settings, catalog.name(OUTPUT), lambda rs: len(rs) >= EXPECTED_OUTPUTS, timeout_s=120
        )
        errors = await wait_for_records(settings, catalog.name(ERRORS), lambda rs: len(rs) >= 2, timeout_s=60)

        empty_panels = prometheus.wait_nonempty(panel_queries(DASHBOARDS, variables), timeout_s=60)
        variable_values = {}
        for (dashboard, name), query in variable_queries(DASHBOARDS, variables).items():
            result = prometheus.query(query.expr)
            variable_values[(dashboard, name)] = {value for r in result for value in r["metric"].values()}
        identity_problems = await eventually(identity_check(prometheus, settings, catalog), timeout_s=30)
        groups = prometheus.wait_rules_healthy()

    reasons = sorted(decode(r.value, ErrorRecord).reason for r in errors)
    assert reasons == ["malformed_record", "orphaned_result"], reasons
    assert len(outputs) == EXPECTED_OUTPUTS, [r.value for r in outputs]

    problems = [f"empty panel: {query}" for query in empty_panels]
    for (dashboard, name), values in variable_values.items():
        wanted = {"job": {WORKER_JOB, EFFECTOR_JOB}, "prefix": {settings.topic_prefix}}.get(name, set())
        if not values or not wanted <= values:
            problems.append(f"{dashboard}: variable {name} offers {sorted(values)}, wanted {sorted(wanted)}")
    problems += [f"identity: {problem}" for problem in identity_problems]
    assert not problems, "\n".join(problems)
    assert {group["name"] for group in groups} >= {"keylane.recording", "keylane.alerts"}
