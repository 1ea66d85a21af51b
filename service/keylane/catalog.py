"""The topic catalog: reads topics/catalog.toml into TopicSpecs with the deployment prefix applied.

Code never spells a topic name; it asks the catalog, e.g. ``catalog.name("agent.events")``.

Replication: each topic has a ``replication_factor`` (the catalog's value, or the deployment's
override, KEYLANE_REPLICATION_FACTOR) and a ``min_insync_replicas``, by default
``min(2, replication_factor)``: with acks=all, a write then survives the loss of any one
replica, and a cluster with one broker down still takes writes. keylane sets it as a topic
config, so it holds whatever the brokers' own default is.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from keylane.errors import ConfigError

CleanupPolicy = Literal["delete", "compact", "compact,delete"]
_POLICIES: frozenset[str] = frozenset({"delete", "compact", "compact,delete"})

# The logical names the system uses; the catalog file must define exactly these.
EVENTS = "agent.events"
EVENTS_SHARDED = "agent.events.sharded"
RESULTS = "agent.results"
APPROVALS = "agent.approvals"
TIMERS = "agent.timers"
INTENTS = "agent.intents"
APPROVAL_REQUESTS = "agent.approval-requests"
OUTPUT = "agent.output"
ERRORS = "agent.errors"
CONTROL = "agent.control"
LOGICAL_NAMES: tuple[str, ...] = (
    EVENTS,
    EVENTS_SHARDED,
    RESULTS,
    APPROVALS,
    TIMERS,
    INTENTS,
    APPROVAL_REQUESTS,
    OUTPUT,
    ERRORS,
    CONTROL,
)


@dataclass(frozen=True, kw_only=True)
class TopicSpec:
    """One topic as the catalog wants it on the broker."""

    logical_name: str
    name: str
    partitions: int
    replication_factor: int
    min_insync_replicas: int
    """Replicas that must have a write before an acks=all produce succeeds (1..replication_factor)."""
    cleanup_policy: CleanupPolicy
    retention_ms: int
    max_message_bytes: int
    co_partitioned: bool
    description: str = ""

    def broker_configs(self) -> dict[str, str]:
        """The topic-level configs keylane manages, as the broker spells them."""
        return {
            "cleanup.policy": self.cleanup_policy,
            "retention.ms": str(self.retention_ms),
            "max.message.bytes": str(self.max_message_bytes),
            "min.insync.replicas": str(self.min_insync_replicas),
        }


@dataclass(frozen=True)
class Catalog:
    """Every topic keylane uses, with the prefix already applied to the names."""

    topics: Mapping[str, TopicSpec]
    prefix: str

    def __iter__(self) -> Iterator[TopicSpec]:
        return iter(self.topics.values())

    def __getitem__(self, logical_name: str) -> TopicSpec:
        return self.topics[logical_name]

    def name(self, logical_name: str) -> str:
        """The broker-side topic name for a logical name such as ``agent.events``."""
        return self.topics[logical_name].name


def default_catalog_path() -> Path:
    """KEYLANE_TOPIC_CATALOG, else the copy packaged in a wheel, else the repository's topics/."""
    explicit = os.environ.get("KEYLANE_TOPIC_CATALOG")
    if explicit:
        return Path(explicit)
    packaged = Path(__file__).with_name("catalog.toml")
    if packaged.exists():
        return packaged
    # service/keylane/catalog.py -> the repository root is three levels up.
    return Path(__file__).resolve().parents[2] / "topics" / "catalog.toml"


def load_catalog(
    *, prefix: str = "", replication_factor: int | None = None, path: Path | None = None
) -> Catalog:
    """Parse the catalog file and apply the deployment prefix and replication override.

    ``replication_factor`` replaces every topic's; a topic's ``min_insync_replicas`` is the
    catalog's explicit value, else ``min(2, replication_factor)``, and must not exceed it.
    """
    source = path or default_catalog_path()
    try:
        raw = tomllib.loads(source.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"topic catalog {source} not found; set KEYLANE_TOPIC_CATALOG to its path"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"topic catalog {source} is not valid TOML ({exc}); fix the file") from None
    defaults: dict[str, Any] = raw.get("defaults", {})
    entries: dict[str, dict[str, Any]] = raw.get("topics", {})
    missing = [n for n in LOGICAL_NAMES if n not in entries]
    unknown = [n for n in entries if n not in LOGICAL_NAMES]
    if missing or unknown:
        raise ConfigError(
            f"topic catalog {source} must define exactly the system's topics "
            f"(missing: {missing or 'none'}, unknown: {unknown or 'none'})"
        )
    topics: dict[str, TopicSpec] = {}
    for logical in LOGICAL_NAMES:
        merged = {**defaults, **entries[logical]}
        topics[logical] = _spec(source, logical, prefix, merged, replication_factor)
    co = {t.partitions for t in topics.values() if t.co_partitioned}
    if len(co) > 1:
        raise ConfigError(
            f"topic catalog {source}: co-partitioned topics disagree on partitions {sorted(co)}; "
            "give them one count"
        )
    return Catalog(topics=topics, prefix=prefix)


def _spec(
    source: Path, logical: str, prefix: str, merged: dict[str, Any], replication_factor: int | None
) -> TopicSpec:
    def need_int(key: str, minimum: int) -> int:
        value = merged.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ConfigError(f"topic catalog {source}: {logical}.{key} must be an integer >= {minimum}")
        return value

    policy = merged.get("cleanup_policy", "delete")
    if policy not in _POLICIES:
        raise ConfigError(
            f"topic catalog {source}: {logical}.cleanup_policy must be one of {sorted(_POLICIES)}"
        )
    replicas = replication_factor or need_int("replication_factor", 1)
    min_insync = need_int("min_insync_replicas", 1) if "min_insync_replicas" in merged else min(2, replicas)
    if min_insync > replicas:
        raise ConfigError(
            f"topic catalog {source}: {logical}.min_insync_replicas is {min_insync} but the replication "
            f"factor is {replicas}: no write could succeed; lower min_insync_replicas or raise "
            "KEYLANE_REPLICATION_FACTOR"
        )
    return TopicSpec(
        logical_name=logical,
        name=prefix + logical,
        partitions=need_int("partitions", 1),
        replication_factor=replicas,
        min_insync_replicas=min_insync,
        cleanup_policy=policy,
        retention_ms=need_int("retention_ms", -1),
        max_message_bytes=need_int("max_message_bytes", 1024),
        co_partitioned=bool(merged.get("co_partitioned", False)),
        description=str(merged.get("description", "")),
    )
