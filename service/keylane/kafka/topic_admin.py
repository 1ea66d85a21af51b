"""Compare the topic catalog with a broker, and create what is missing (`keylane topics`).

Guarantees of :func:`apply_catalog`, in order:

1. it inspects every catalog topic before changing anything;
2. if any existing topic's partition count differs from the catalog it raises TopicDrift
   and changes nothing (partition count decides a key's lane, so it is a correctness input);
3. it creates the missing topics with the catalog's partitions, replication and configs,
   and returns once every broker's metadata lists them (see
   :func:`wait_until_every_broker_knows`);
4. it sets the managed configs (cleanup.policy, retention.ms, max.message.bytes,
   min.insync.replicas) of existing topics that drifted, and leaves topics that match alone;
5. replication-factor drift is reported, not changed (that needs a partition reassignment);
   so is a replication factor below what the cluster could give (``min(3, brokers)``), e.g.
   the local default of 1 applied to a 3-broker cluster.

A replication factor above the number of brokers is refused by the broker; the error says
which setting to lower.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaConnectionError, KafkaError
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.protocol.offset import OffsetRequest

from keylane.catalog import Catalog, TopicSpec
from keylane.config import Settings
from keylane.errors import BrokerUnavailable, TopicDrift

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 15.0
METADATA_WAIT_S = 30.0
RETRY_S = 30.0
_T = TypeVar("_T")
_UNKNOWN_TOPIC = 3
_TOPIC_EXISTS = 36
RECOMMENDED_REPLICAS = 3  # what Kafka operators run: survives one broker down with min.insync 2


@dataclass(frozen=True)
class Drift:
    """One difference between the catalog and the broker for one topic."""

    setting: str
    want: str
    have: str

    def __str__(self) -> str:
        return f"{self.setting}: catalog {self.want}, broker {self.have}"


@dataclass(frozen=True)
class TopicReport:
    """What the broker has for one catalog topic."""

    spec: TopicSpec
    status: Literal["missing", "ok", "drift"]
    drifts: tuple[Drift, ...] = ()

    @property
    def partition_mismatch(self) -> Drift | None:
        return next((d for d in self.drifts if d.setting == "partitions"), None)


@dataclass
class ApplyResult:
    """What :func:`apply_catalog` did; ``changed`` is False when the broker already matched."""

    created: list[str] = field(default_factory=list)
    reconfigured: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.reconfigured)


def broker_unreachable(settings: Settings, exc: BaseException) -> BrokerUnavailable:
    """The one way every command says that no broker answered: where the address came from
    and what to do."""
    return BrokerUnavailable(
        f"cannot reach Kafka at {settings.bootstrap_servers} ({settings.bootstrap_source}; "
        f"{type(exc).__name__}); start a local one with 'make run' or 'make broker', or set "
        "KEYLANE_BOOTSTRAP_SERVERS / --bootstrap-servers to a running cluster"
    )


@contextmanager
def quiet_client_logs() -> Iterator[None]:
    """Keep aiokafka's own log lines (each failed connection, each retried NotLeaderForPartition
    of a fresh topic) off the terminal for the block: where a command or a start-up check says
    what failed in one line (``broker_unreachable``), or a benchmark's fresh topics settle.
    Real failures still raise."""
    client_log = logging.getLogger("aiokafka")
    level = client_log.level
    client_log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        client_log.setLevel(level)


@asynccontextmanager
async def admin_client(settings: Settings) -> AsyncIterator[AIOKafkaAdminClient]:
    """An admin client connected to the settings' bootstrap servers, closed on exit."""
    client = AIOKafkaAdminClient(
        bootstrap_servers=settings.bootstrap_list,
        client_id="keylane-admin",
        request_timeout_ms=int(CONNECT_TIMEOUT_S * 1000),
    )
    try:
        await asyncio.wait_for(client.start(), timeout=CONNECT_TIMEOUT_S)
    except (KafkaConnectionError, KafkaError, OSError, TimeoutError) as exc:
        await client.close()
        raise broker_unreachable(settings, exc) from exc
    try:
        yield client
    finally:
        await client.close()


async def retry_retriable(call: Callable[[], Awaitable[_T]], *, timeout_s: float | None = None) -> _T:
    """Run an admin request again while it fails with a retriable Kafka error, for up to
    ``timeout_s`` (RETRY_S). A broker that was just killed stays in the cluster metadata until
    the controller fences it, and a request the admin client sends it fails at once
    (NodeNotReadyError); the next try goes to a broker that answers. Every request retried
    here is idempotent (a create that already happened reports TOPIC_ALREADY_EXISTS).

    A retriable error that outlasts the time is BrokerUnavailable: one line for the command or
    the start-up check that asked (a cluster whose coordinator or leaders stay away), not the
    client's traceback. Any other error is raised as it came."""
    limit_s = RETRY_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + limit_s
    while True:
        try:
            return await call()
        except KafkaError as exc:
            if not exc.retriable:
                raise
            if time.monotonic() > deadline:
                said = " ".join(str(exc).split()) or type(exc).__name__
                raise BrokerUnavailable(
                    f"Kafka kept answering {said} for {limit_s:g} s: a broker "
                    "or the group coordinator stays unavailable; check that every broker is up and that "
                    "__consumer_offsets and the catalog's topics have leaders, then start again"
                ) from exc
        await asyncio.sleep(0.2)


async def inspect_catalog(client: AIOKafkaAdminClient, catalog: Catalog) -> list[TopicReport]:
    """Describe every catalog topic on the broker and list how each differs."""
    specs = list(catalog)
    described = await retry_retriable(lambda: client.describe_topics([s.name for s in specs]))
    by_name: dict[str, dict[str, Any]] = {d["topic"]: d for d in described}
    present = [s for s in specs if by_name.get(s.name, {}).get("error_code") == 0]
    configs = await _topic_configs(client, [s.name for s in present])
    reports: list[TopicReport] = []
    for spec in specs:
        info = by_name.get(spec.name)
        if info is None or info["error_code"] == _UNKNOWN_TOPIC:
            reports.append(TopicReport(spec, "missing"))
            continue
        if info["error_code"] != 0:
            raise TopicDrift(f"broker reports error {info['error_code']} for topic {spec.name}")
        drifts = _diff(spec, info, configs.get(spec.name, {}))
        reports.append(TopicReport(spec, "drift" if drifts else "ok", tuple(drifts)))
    return reports


def _diff(spec: TopicSpec, info: dict[str, Any], configs: dict[str, str]) -> list[Drift]:
    drifts: list[Drift] = []
    partitions = info["partitions"]
    if len(partitions) != spec.partitions:
        drifts.append(Drift("partitions", str(spec.partitions), str(len(partitions))))
    replicas = {len(p["replicas"]) for p in partitions}
    if replicas and replicas != {spec.replication_factor}:
        drifts.append(
            Drift("replication_factor", str(spec.replication_factor), "/".join(map(str, sorted(replicas))))
        )
    for key, want in spec.broker_configs().items():
        have = configs.get(key)
        if have != want:
            drifts.append(Drift(key, want, str(have)))
    return drifts


async def wait_until_every_broker_knows(
    client: AIOKafkaAdminClient, names: list[str], *, timeout_s: float = METADATA_WAIT_S
) -> list[str]:
    """Wait until every reachable broker's metadata lists each topic with its partitions;
    returns what is still missing at the deadline (empty: all known).

    A new topic reaches each broker's metadata a moment after the controller created it. A
    client that asks a broker which has not caught up is told the topic does not exist, and
    Faust's consumer keeps that answer for metadata.max.age.ms (5 minutes): its assignor
    then skips the changelog and every table write fails with PartitionsMismatch ("the
    changelog has 0 partitions"). On one broker the window is too short to see; on three it
    is not. A broker that cannot be reached is skipped: it serves nobody stale answers.
    """
    brokers = [b["node_id"] for b in (await retry_retriable(client.describe_cluster))["brokers"]]
    inner = client._client  # the public admin API asks one broker; this asks each
    deadline = time.monotonic() + timeout_s
    while True:
        behind: list[str] = []
        for node_id in brokers:
            try:
                response = await inner.send(node_id, MetadataRequest(names, allow_auto_topic_creation=False))
            except (KafkaError, OSError):
                continue
            known = {
                t["topic"] for t in response.to_object()["topics"] if t["error_code"] == 0 and t["partitions"]
            }
            behind.extend(f"{name} (broker {node_id})" for name in names if name not in known)
        if not behind or time.monotonic() > deadline:
            return behind
        await asyncio.sleep(0.1)


async def wait_until_leaders_serve(
    client: AIOKafkaAdminClient, names: list[str], *, timeout_s: float = METADATA_WAIT_S
) -> list[str]:
    """Wait until the leader of every partition of ``names`` answers for it (a ListOffsets
    for its end, sent to the leader the metadata names); returns the partitions that still
    did not at the deadline (empty: all serve).

    The metadata names a fresh topic's leaders a moment before those brokers act as leaders:
    a record produced in between is answered NotLeaderForPartition, and the producer logs a
    warning for each retry. Nothing is lost, but a worker's first log lines and a benchmark's
    first figures should not carry that noise, so whoever creates topics waits this out.
    """
    inner = client._client  # the public admin API has no ListOffsets
    deadline = time.monotonic() + timeout_s
    while True:
        waiting: list[str] = []
        by_leader: dict[int, dict[str, list[int]]] = {}
        for described in await retry_retriable(lambda: client.describe_topics(names)):
            topic = described["topic"]
            if described["error_code"] != 0 or not described["partitions"]:
                waiting.append(topic)
                continue
            for partition in described["partitions"]:
                if partition["leader"] < 0:
                    waiting.append(f"{topic}/{partition['partition']}")
                else:
                    by_leader.setdefault(partition["leader"], {}).setdefault(topic, []).append(
                        partition["partition"]
                    )
        for leader, topics in by_leader.items():
            request = OffsetRequest(
                replica_id=-1,
                isolation_level=0,
                topics=[(topic, [(p, -1) for p in parts]) for topic, parts in topics.items()],
            )
            try:
                answer = (await inner.send(leader, request)).to_object()
            except (KafkaError, OSError):
                waiting.extend(f"{topic}/{p}" for topic, parts in topics.items() for p in parts)
                continue
            waiting.extend(
                f"{t['topic']}/{p['partition']}"
                for t in answer["topics"]
                for p in t["partitions"]
                if p["error_code"] != 0
            )
        if not waiting or time.monotonic() > deadline:
            return waiting
        await asyncio.sleep(0.05)


async def ensure_topic(
    client: AIOKafkaAdminClient,
    *,
    name: str,
    partitions: int,
    replication_factor: int,
    configs: dict[str, str],
) -> bool:
    """Create a topic keylane needs outside the catalog (a Faust table's changelog) unless it
    exists, then wait until every broker's metadata lists it; True when this call created it.

    An existing topic whose configs differ from ``configs`` gets exactly ``configs`` as its
    overrides, as ``topics apply`` does for the catalog's topics: a changelog an older
    keylane created with the broker's max.message.bytes (about 1 MiB) would refuse a state
    blob the runtime allows, and one without min.insync.replicas takes writes on one replica.
    Its partitions and replication factor are never changed.
    """
    described = await retry_retriable(lambda: client.describe_topics([name]))
    created = False
    if any(d["topic"] == name and d["error_code"] == 0 for d in described):
        current = (await _topic_configs(client, [name])).get(name, {})
        drift = {k: (current.get(k), v) for k, v in configs.items() if current.get(k) != v}
        if drift:
            wanted = [ConfigResource(ConfigResourceType.TOPIC, name, configs)]
            responses = await retry_retriable(lambda: client.alter_configs(wanted))
            for response in responses:
                for code, message, *_ in response.resources:
                    if code != 0:
                        raise TopicDrift(f"updating configs of {name} failed: {message or code}")
            log.info("updated configs of %s (was, now): %s", name, drift)
    else:
        new = [NewTopic(name, partitions, replication_factor, topic_configs=configs)]
        response = await retry_retriable(lambda: client.create_topics(new))
        for _name, code, message in response.topic_errors:
            if code not in (0, _TOPIC_EXISTS):  # another worker may have created it a moment ago
                raise TopicDrift(f"creating topic {name} failed: {message or code}")
        created = True
        log.info(
            "created topic %s (%s partitions, replication factor %s)", name, partitions, replication_factor
        )
    unknown = await wait_until_every_broker_knows(client, [name])
    if unknown:
        log.warning(
            "topic %s is not in every broker's metadata after %ss: %s", name, METADATA_WAIT_S, unknown
        )
    elif created and (leaderless := await wait_until_leaders_serve(client, [name])):
        log.warning("topic %s has partitions whose leader does not serve yet: %s", name, leaderless[:3])
    return created


async def broker_count(client: AIOKafkaAdminClient) -> int:
    """How many brokers the cluster's metadata lists."""
    return len((await retry_retriable(client.describe_cluster))["brokers"])


async def _topic_configs(client: AIOKafkaAdminClient, names: list[str]) -> dict[str, dict[str, str]]:
    if not names:
        return {}
    resources = [ConfigResource(ConfigResourceType.TOPIC, n) for n in names]
    responses = await retry_retriable(lambda: client.describe_configs(resources))
    result: dict[str, dict[str, str]] = {}
    for response in responses:
        for error_code, _msg, _type, name, entries in response.resources:
            if error_code == 0:
                result[name] = {entry[0]: entry[1] for entry in entries}
    return result


async def apply_catalog(client: AIOKafkaAdminClient, catalog: Catalog) -> ApplyResult:
    """Make the broker match the catalog as far as that is safe; see the module docstring."""
    reports = await inspect_catalog(client, catalog)
    mismatched = [r for r in reports if r.partition_mismatch is not None]
    if mismatched:
        first = mismatched[0]
        raise TopicDrift(
            f"topic {first.spec.name} has {first.partition_mismatch.have} partitions but the catalog "  # type: ignore[union-attr]
            f"says {first.spec.partitions}; co-partitioning needs them equal: recreate the topic with "
            f"{first.spec.partitions} partitions or use another --topic-prefix"
        )
    brokers = await broker_count(client)
    too_many = [r.spec for r in reports if r.status == "missing" and r.spec.replication_factor > brokers]
    if too_many:
        raise TopicDrift(
            f"topic {too_many[0].name} needs replication factor {too_many[0].replication_factor} but the "
            f"cluster has {brokers} broker(s); set KEYLANE_REPLICATION_FACTOR to at most {brokers} "
            "(nothing was changed)"
        )
    result = ApplyResult()
    recommended = min(RECOMMENDED_REPLICAS, brokers)
    under = [r.spec.name for r in reports if r.spec.replication_factor < recommended]
    if under:
        result.warnings.append(
            f"{len(under)} topic(s) ({under[0]}, ...) have replication factor below {recommended} on a "
            f"cluster of {brokers} brokers: losing one broker can lose their data; set "
            f"KEYLANE_REPLICATION_FACTOR={recommended}"
        )
    missing = [r.spec for r in reports if r.status == "missing"]
    if missing:
        new_topics = [
            NewTopic(s.name, s.partitions, s.replication_factor, topic_configs=s.broker_configs())
            for s in missing
        ]
        response = await retry_retriable(lambda: client.create_topics(new_topics))
        for name, code, message in response.topic_errors:
            if code not in (0, _TOPIC_EXISTS):
                raise TopicDrift(f"creating topic {name} failed: {message or code}")
        result.created = [s.name for s in missing]
        unknown = await wait_until_every_broker_knows(client, result.created)
        if unknown:
            result.warnings.append(
                f"created topics not yet in every broker's metadata after {METADATA_WAIT_S:.0f}s: "
                + ", ".join(unknown[:3])
            )
        elif leaderless := await wait_until_leaders_serve(client, result.created):
            result.warnings.append(
                f"created topics whose leaders do not serve yet after {METADATA_WAIT_S:.0f}s: "
                + ", ".join(leaderless[:3])
            )
    for report in reports:
        if report.status == "ok":
            result.unchanged.append(report.spec.name)
        elif report.status == "drift":
            config_drift = [d for d in report.drifts if d.setting in report.spec.broker_configs()]
            if config_drift:
                # AlterConfigs (not the incremental form) replaces the topic's overrides
                # with exactly the catalog's: the catalog is the source of truth.
                wanted = [
                    ConfigResource(ConfigResourceType.TOPIC, report.spec.name, report.spec.broker_configs())
                ]
                responses = await retry_retriable(lambda: client.alter_configs(wanted))  # noqa: B023 - awaited here
                for response in responses:
                    for code, message, *_ in response.resources:
                        if code != 0:
                            raise TopicDrift(
                                f"updating configs of {report.spec.name} failed: {message or code}"
                            )
                result.reconfigured.append(report.spec.name)
            else:
                result.unchanged.append(report.spec.name)
            result.warnings.extend(
                f"{report.spec.name}: {d} (not changed: needs a partition reassignment)"
                for d in report.drifts
                if d.setting == "replication_factor"
            )
    return result
