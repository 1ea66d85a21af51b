"""Which agent a consumer group runs: a worker announces its agent in its Kafka client id and
refuses to join a group whose live members run another one.

Two different agents in one group would split the keys between them, each loading the
other's state and answering the other's events. The client id is where the agent is named
because every member of a group already shows it to the broker, and so to anyone who
describes the group (``kafka-consumer-groups.sh --describe`` lists it as CLIENT-ID): no
topic, no record, nothing to clean up when a deployment changes its agent on purpose (stop
the old workers, start the new ones). The check runs before the worker joins; two different
agents started within the same second can both pass it, which this does not try to prevent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias, cast

from aiokafka.errors import for_code
from aiokafka.protocol.admin import (
    DescribeGroupsRequest_v0,
    DescribeGroupsRequest_v1,
    DescribeGroupsRequest_v2,
)
from aiokafka.protocol.api import Request

from keylane.config import Settings
from keylane.errors import ConfigError
from keylane.kafka.topic_admin import admin_client, retry_retriable

WORKER_CLIENT_PREFIX = "keylane-worker/"

_DescribeGroupsUpToV2: TypeAlias = (
    DescribeGroupsRequest_v0 | DescribeGroupsRequest_v1 | DescribeGroupsRequest_v2
)


def worker_client_id(agent_ref: str) -> str:
    """The Kafka client id of a worker running ``agent_ref`` (module:function)."""
    return f"{WORKER_CLIENT_PREFIX}{agent_ref}"


@dataclass(frozen=True)
class GroupMember:
    """One live member of a consumer group, as the group coordinator describes it."""

    client_id: str
    host: str

    @property
    def agent(self) -> str | None:
        """The agent a keylane worker member runs; None for any other client."""
        if self.client_id.startswith(WORKER_CLIENT_PREFIX):
            return self.client_id.removeprefix(WORKER_CLIENT_PREFIX)
        return None


class _DescribeGroups(Request[_DescribeGroupsUpToV2]):  # type: ignore[misc]  # aiokafka ships no stubs for Request
    """DescribeGroups up to v2: aiokafka's own request also offers v3, whose response it reads
    with v2's schema (no authorized_operations field), so a broker that speaks v3 (every
    Kafka since 2.3) answers with bytes aiokafka cannot parse and the connection closes."""

    API_KEY = 15

    def __init__(self, group: str) -> None:
        self._group = group

    def build(self, request_struct_class: type[_DescribeGroupsUpToV2]) -> _DescribeGroupsUpToV2:
        return request_struct_class([self._group])


async def group_members(settings: Settings, group: str) -> list[GroupMember]:
    """The live members of ``group`` (none when it is empty or has never existed).

    Asked again, coordinator lookup included, while the answer is a retriable error:
    GroupCoordinatorNotAvailable until a fresh cluster has created __consumer_offsets, and
    NodeNotReady or NotCoordinator while the coordinator's broker is down and its group moves
    to another (a worker restarted during a broker's outage)."""
    async with admin_client(settings) as client:

        async def describe() -> dict[str, Any]:
            coordinator = await client.find_coordinator(group)
            # The admin client's own connection, as its describe_consumer_groups uses: see _DescribeGroups.
            response = await client._client.send(coordinator, _DescribeGroups(group))
            (described,) = response.to_object()["groups"]
            if described["error_code"]:
                raise for_code(described["error_code"])(f"describing consumer group {group!r}")
            return cast(dict[str, Any], described)

        described = await retry_retriable(describe)
    return [GroupMember(m["client_id"], m["client_host"].lstrip("/")) for m in described["members"]]


async def refuse_foreign_agent(settings: Settings, agent_ref: str) -> None:
    """ConfigError, one line, when the worker's consumer group has live members that run an
    agent other than ``agent_ref``: which agent, where, and the settings that separate
    deployments."""
    others = [m for m in await group_members(settings, settings.app_id) if m.agent not in (None, agent_ref)]
    if not others:
        return
    agents = sorted({str(m.agent) for m in others})
    hosts = sorted({m.host for m in others})
    raise ConfigError(
        f"consumer group {settings.app_id!r} already runs agent {', '.join(agents)} "
        f"({len(others)} worker(s) on {', '.join(hosts)}), not {agent_ref}: give this deployment its own "
        "KEYLANE_APP_ID (group and state) and KEYLANE_TOPIC_PREFIX (topics), or stop those workers first "
        "to replace the agent"
    )
