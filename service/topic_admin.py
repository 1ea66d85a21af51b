"""Compare the topic catalog with a broker, and create what is missing (`keylane topics`).

Guarantees of :func:`apply_catalog`, in order:

1. it inspects every catalog topic before changing anything;
2. if any existing topic's partition count differs from the catalog it raises TopicDrift
   and changes nothing (partition count decides a key's lane, so it is a correctness input);
3. it creates the missing topics with the catalog's partitions, replication and configs;
4. it sets the managed configs (cleanup.policy, retention.ms, max.message.bytes) of existing
   topics that drifted, and leaves topics that match alone;
5. replication-factor drift is reported, not changed (that needs a partition reassignment).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaConnectionError, KafkaError

from service.catalog import Catalog, TopicSpec
from service.config import Settings
from service.errors import BrokerUnavailable, TopicDrift

CONNECT_TIMEOUT_S = 15.0
_UNKNOWN_TOPIC = 3
_TOPIC_EXISTS = 36


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
        raise BrokerUnavailable(
            f"cannot reach Kafka at {settings.bootstrap_servers} ({type(exc).__name__}); start one with "
            "'make broker' or point KEYLANE_BOOTSTRAP_SERVERS / --bootstrap-servers at a running cluster"
        ) from exc
    try:
        yield client
    finally:
        await client.close()


async def inspect_catalog(client: AIOKafkaAdminClient, catalog: Catalog) -> list[TopicReport]:
    """Describe every catalog topic on the broker and list how each differs."""
    specs = list(catalog)
    described = await client.describe_topics([s.name for s in specs])
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


async def _topic_configs(client: AIOKafkaAdminClient, names: list[str]) -> dict[str, dict[str, str]]:
    if not names:
        return {}
    responses = await client.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names])
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
    result = ApplyResult()
    missing = [r.spec for r in reports if r.status == "missing"]
    if missing:
        response = await client.create_topics(
            [
                NewTopic(s.name, s.partitions, s.replication_factor, topic_configs=s.broker_configs())
                for s in missing
            ]
        )
        for name, code, message in response.topic_errors:
            if code not in (0, _TOPIC_EXISTS):
                raise TopicDrift(f"creating topic {name} failed: {message or code}")
        result.created = [s.name for s in missing]
    for report in reports:
        if report.status == "ok":
            result.unchanged.append(report.spec.name)
        elif report.status == "drift":
            config_drift = [d for d in report.drifts if d.setting in report.spec.broker_configs()]
            if config_drift:
                # AlterConfigs (not the incremental form) replaces the topic's overrides
                # with exactly the catalog's: the catalog is the source of truth.
                responses = await client.alter_configs(
                    [ConfigResource(ConfigResourceType.TOPIC, report.spec.name, report.spec.broker_configs())]
                )
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
