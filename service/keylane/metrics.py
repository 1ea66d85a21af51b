"""Every Prometheus metric keylane exports, declared once.

Names follow Prometheus' conventions: durations in seconds (``*_seconds`` histograms), sizes
in bytes (``*_bytes``), counters ending in ``_total`` (prometheus_client adds it to a
Counter's name). ``gen_ai_client_*`` are OpenTelemetry's GenAI client metrics as Prometheus
translates them (``gen_ai.client.operation.duration`` and ``gen_ai.client.token.usage``,
with OpenTelemetry's advised buckets). docs/operations.md lists them all; the table in
tests/deploy/metric_contract.py is checked against this registry both ways.

Identities the tests hold (counted when a record is handed to the producer, so a
re-published outbox record counts again, exactly like the record it adds to the topic):

* ``keylane_intents_emitted_total`` == records on agent.intents;
* ``keylane_agent_errors_total`` + ``keylane_orphaned_results_total`` == records on agent.errors;
* ``gen_ai_client_operation_duration_seconds_count`` == ``keylane_llm_calls_total`` (one
  observation per provider call; replay-cache hits count neither).

Labels are bounded: ``reason``, ``detail``, ``kind``, ``status``… come from fixed vocabularies
(``zero_fixed_labels`` exports each value as 0 from start-up, so a ``rate()`` of them exists
before the first event), ``topic`` from the catalog (without the deployment's topic prefix:
``topic_label``), ``partition`` from the topics' partition counts, ``error``/``error_type``
from exception classes, and the ``gen_ai_*`` labels from the provider and the model ids the
agent's code asks for: never from ids, keys or payloads.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar, get_args

from prometheus_client import disable_created_metrics

from keylane.metric_types import Counter, Gauge, Histogram
from keylane.records import OrphanDetail
from keylane.wire import ErrorReason, KeyAction, TimerKind, ToolStatus

# One series per counter, not two: the ``*_created`` samples are OpenMetrics' business, and no
# query of keylane's reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it untyped

SECONDS_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
"""Durations: from keylane's sub-millisecond overhead to multi-second model calls."""
GEN_AI_DURATION_BUCKETS = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
"""OpenTelemetry's advised boundaries for ``gen_ai.client.operation.duration``."""
GEN_AI_TOKEN_BUCKETS = tuple(4**i for i in range(14))
"""OpenTelemetry's advised boundaries for ``gen_ai.client.token.usage``: 1, 4, 16, … 67108864."""
_BYTES_BUCKETS = (256, 1024, 4096, 16384, 65536, 262144, 524288, 786432, 1048576)
_GEN_AI = ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model"]
_TOPIC_PARTITION = ["topic", "partition"]

GEN_AI_CHAT = "chat"
"""``gen_ai_operation_name`` of every model call keylane makes (OpenTelemetry's well-known value)."""

# -- activations ------------------------------------------------------------------------------

ACTIVATIONS = Counter("keylane_activations", "Committed activations (starts and resumes).", ["kind"])
TOOL_CALLS = Counter("keylane_tool_calls", "Read-only tool calls run inline.")
INTENTS_EMITTED = Counter("keylane_intents_emitted", "Records produced to agent.intents.")
AGENT_ERRORS = Counter(
    "keylane_agent_errors", "Records produced to agent.errors, except orphans.", ["reason"]
)
ORPHANED_RESULTS = Counter(
    "keylane_orphaned_results", "Results or approvals refused by resume admission.", ["detail"]
)
SUSPENSIONS = Counter("keylane_suspensions", "Committed activations that suspended.")
EVENTS_BUFFERED = Counter("keylane_events_buffered", "Events queued behind a suspended key.")
RECORDS_REROUTED = Counter(
    "keylane_records_rerouted", "Input records on the wrong partition for their key, re-produced.", ["topic"]
)
REDELIVERIES = Counter(
    "keylane_redeliveries",
    "Input records recognised as already applied (a redelivery or another copy of one).",
    ["topic"],
)
POISON_RECORDS = Counter(
    "keylane_poison_records",
    "Input records whose processing kept raising, dead-lettered after bounded retries.",
    ["topic"],
)
STALL_REREADS = Counter(
    "keylane_stall_rereads",
    "Input partitions read again because records waited from the expected offset on and none arrived.",
    ["topic"],
)
RESTORE_REREADS = Counter(
    "keylane_restore_rereads",
    "Active changelog partitions whose table restore applied nothing while records remained, read again.",
)
STREAMS_RESTARTED = Counter(
    "keylane_streams_restarted",
    "Originals below a key's applied offset while the log ends below it: a recreated topic.",
    ["topic"],
)
UNAWAITED_RESULTS = Counter(
    "keylane_unawaited_results",
    "Results and approvals for intents nobody waits for any more (fire-and-forget, or "
    "answered already): acknowledged, not dead-lettered.",
    ["kind"],
)
MEMORY_SOFT_CAP_WARNINGS = Counter(
    "keylane_memory_soft_cap_warnings", "Activations that crossed the soft cap."
)
OUTPUTS = Counter("keylane_outputs", "Records produced to agent.output.")
UNSIGNED = Counter(
    "keylane_unsigned_records", "Intents, approvals or results with a missing or bad signature.", ["kind"]
)
KEY_COMMANDS = Counter(
    "keylane_key_commands",
    "Operator commands on one key (agent.control) a key's lane applied, by action (cancel, "
    "pause, resume) and outcome: done, or what made it change nothing (not_suspended, "
    "already_paused, not_paused).",
    ["action", "outcome"],
)
TIMERS_FIRED = Counter("keylane_timers_fired", "Due timer fires applied by a key's lane.", ["kind"])
TIMERS_IGNORED = Counter("keylane_timers_ignored", "Timer fires ignored as stale, early or duplicate.")
TIMERS_SENT = Counter("keylane_timers_sent", "Timer-fired commands sent by the scan.", ["kind"])
STALE_STATE_WRITES = Counter(
    "keylane_stale_state_writes",
    "Keys (a worker's states, an effector's claims) whose last changelog record a restore skipped "
    "as a former owner's late write (a paused or revoked process's, landed after its successor's); "
    "the owner wrote each again.",
)
QUARANTINED_KEYS = Gauge(
    "keylane_quarantined_keys",
    "Keys of this worker's partitions whose stored state does not read (a newer keylane's "
    "blob, or corrupt): their inputs are dead-lettered as poison_state.",
)
REDRIVEN_RECORDS = Counter(
    "keylane_redriven_records",
    "Input records a worker read that re-drive a dead letter (keylane errors redrive: they carry "
    "keylane.redrive-of), by the logical topic they came back on.",
    ["topic"],
)
PAUSED_KEYS = Gauge(
    "keylane_paused_keys",
    "Keys of this worker's partitions an operator paused (keylane pause): their inputs are held.",
)
INPUTS_HELD = Counter(
    "keylane_inputs_held",
    "Inputs a paused key held for its resume, by the logical topic they came from.",
    ["topic"],
)
WAITING_KEYS = Gauge(
    "keylane_waiting_keys",
    "Keys of this worker's partitions suspended now, by what they wait for: approval (at least "
    "one approval request pending) or tool (tool results only).",
    ["kind"],
)

ACTIVATION_SECONDS = Histogram(
    "keylane_activation_duration_seconds",
    "Wall time of one activation, model and tools included.",
    buckets=SECONDS_BUCKETS,
)
OVERHEAD_SECONDS = Histogram(
    "keylane_activation_overhead_seconds",
    "Activation wall time minus model and tool time: keylane's own cost.",
    buckets=SECONDS_BUCKETS,
)
MEMORY_BYTES = Histogram(
    "keylane_memory_bytes", "Committed memory size per activation.", buckets=_BYTES_BUCKETS
)

# -- model calls ------------------------------------------------------------------------------

LLM_CALLS = Counter("keylane_llm_calls", "Model calls that reached the provider.")
LLM_CACHE_HITS = Counter("keylane_llm_cache_hits", "Model calls answered by the replay cache.")
LLM_SECONDS = Histogram(
    "keylane_llm_call_duration_seconds",
    "Wall time of one model call that reached the provider: rate-limit wait, retries and backoff included.",
    buckets=SECONDS_BUCKETS,
)
RATE_LIMIT_WAIT_SECONDS = Histogram(
    "keylane_rate_limit_wait_seconds",
    "Time a provider call waited for its key's or the worker's rate limit.",
    buckets=SECONDS_BUCKETS,
)
LLM_ERRORS = Counter(
    "keylane_llm_errors", "Provider calls that failed after retries, by error class.", ["error"]
)
LLM_RETRIES = Counter("keylane_llm_retries", "Provider attempts retried, by error class.", ["error"])
LLM_BREAKER_OPEN = Gauge(
    "keylane_llm_breaker_open", "1 while the provider's circuit breaker is open or half-open, else 0."
)
GEN_AI_DURATION = Histogram(
    "gen_ai_client_operation_duration_seconds",
    "GenAI operation duration (OpenTelemetry gen_ai.client.operation.duration): one provider "
    "call, its retries included; error_type is the error's class when it failed, else empty.",
    [*_GEN_AI, "error_type"],
    buckets=GEN_AI_DURATION_BUCKETS,
)
GEN_AI_TOKENS = Histogram(
    "gen_ai_client_token_usage",
    "Tokens per provider call as the provider reported them, input and output (OpenTelemetry "
    "gen_ai.client.token.usage).",
    [*_GEN_AI, "gen_ai_token_type"],
    buckets=GEN_AI_TOKEN_BUCKETS,
)

# -- lanes and partitions ---------------------------------------------------------------------

IN_FLIGHT = Gauge("keylane_in_flight", "Records being processed now, per partition.", ["partition"])
LANE_QUEUE_DEPTH = Gauge(
    "keylane_lane_queue_depth",
    "Records waiting for their lane (a busy key shows here), per partition.",
    ["partition"],
)
RECORDS_ABANDONED = Counter(
    "keylane_records_abandoned",
    "Records given up on a revocation (not started, or cancelled after the grace period); "
    "the partition's next owner runs them.",
)
PARTITION_PAUSES = Counter(
    "keylane_partition_pauses",
    "Times fetching stopped for a topic-partition whose lane window was full.",
    ["partition"],
)
LANE_WAIT_SECONDS = Histogram(
    "keylane_lane_wait_seconds",
    "Time a record waited for its lane before it ran.",
    buckets=SECONDS_BUCKETS,
)

# Consumer position of each input partition assigned to this process (docs/operations.md, "Lag").
CONSUMER_LAG = Gauge(
    "keylane_consumer_lag",
    "Records between the group's committed offset and the log end of an assigned input partition.",
    _TOPIC_PARTITION,
)
CONSUMER_COMMITTED_OFFSET = Gauge(
    "keylane_consumer_committed_offset",
    "The group's committed offset of an assigned input partition (before its first commit: the "
    "offset reading started from).",
    _TOPIC_PARTITION,
)
CONSUMER_LAST_COMMIT = Gauge(
    "keylane_consumer_last_commit_timestamp_seconds",
    "Unix time of the last commit that advanced an assigned input partition's offset (its "
    "assignment, until this process commits it).",
    _TOPIC_PARTITION,
)

# -- the effector -----------------------------------------------------------------------------

EFFECTOR_INTENTS = Counter(
    "keylane_effector_intents", "Intents the effector finished, by status.", ["status"]
)
EFFECTOR_EXECUTIONS = Counter("keylane_effector_executions", "Tool executions the effector started.")
EFFECTOR_REPUBLISHED = Counter(
    "keylane_effector_republished", "Intents already Done whose stored result was republished."
)

# The effector's in-doubt window (docs/effector.md).
IN_DOUBT_RESOLUTIONS = ("reconciled_done", "reconciled_not_done", "rerun", "error", "expired")
EFFECTOR_IN_DOUBT = Counter(
    "keylane_effector_in_doubt",
    "Intents found claimed without an outcome after their lease (an attempt died mid-tool), "
    "by resolution: reconciled_done, reconciled_not_done, rerun, error, expired.",
    ["resolution"],
)

# -- size discipline of a key's state: queued events and the whole blob (docs/runtime.md) ------

BUFFER_LIMITS = ("events", "bytes", "state")
BUFFERED_EVENTS_REJECTED = Counter(
    "keylane_buffered_events_rejected",
    "Events for a suspended key dead-lettered as buffer_full, by the limit they met: events "
    "(max_buffered_events), bytes (max_buffered_bytes) or state (the key's state limit).",
    ["limit"],
)
BUFFERED_DEPTH = Histogram(
    "keylane_buffered_depth",
    "Events queued behind a key's suspension, observed each time one more is queued.",
    buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10000),
)
STATE_BYTES = Histogram(
    "keylane_state_bytes",
    "Size of each key state the runtime commits: its changelog record, plus the memory in its "
    "pages for a key whose memory is paged.",
    buckets=(1024, 4096, 16384, 65536, 262144, 524288, 786432, 1048576, 1572864, 2097152),
)
STATE_OVER_LIMIT = Counter(
    "keylane_state_over_limit",
    "Activations (queued ones included) failed as state_too_large: their next state would not "
    "fit the key's state limit even without its replay cache.",
)
STATE_CACHE_TRIMMED = Counter(
    "keylane_state_cache_trimmed",
    "Replay-cache entries dropped so that a key's next state fits its limit.",
)

# Records too large to produce (docs/runtime.md, "Size limits and produce failures").
RECORDS_TOO_LARGE = Counter(
    "keylane_records_too_large",
    "Records over their topic's limit (min of max.message.bytes and the producer's max request "
    "size), by the logical topic they were for; each went to agent.errors as a dead letter "
    "carrying a sha256 and a prefix of its bytes instead.",
    ["topic"],
)

# -- the process ------------------------------------------------------------------------------

INFO = Gauge(
    "keylane_info",
    "1 for each keylane process: its role (worker, effector), app id, topic prefix and version.",
    ["role", "app_id", "topic_prefix", "version"],
)

WAITING_KINDS = ("approval", "tool")
UNSIGNED_KINDS = ("intent", "approval", "result", "command")
KEY_COMMAND_OUTCOMES: dict[str, tuple[str, ...]] = {
    "cancel": ("done", "not_suspended"),
    "pause": ("done", "already_paused"),
    "resume": ("done", "not_paused"),
}
ACTIVATION_KINDS = ("start", "resume")


def zero_fixed_labels() -> None:
    """Export every value of each fixed label vocabulary as 0, so that a ``rate()`` of it
    exists (and the dashboards show 0, not "no data") before its first event. Labels from the
    catalog (``topic``), the assignment (``partition``) or the provider are zeroed where those
    are known (``zero``)."""
    zero(ACTIVATIONS, ACTIVATION_KINDS)
    zero(AGENT_ERRORS, (r for r in get_args(ErrorReason) if r != "orphaned_result"))  # orphans: below
    zero(ORPHANED_RESULTS, get_args(OrphanDetail))
    zero(UNSIGNED, UNSIGNED_KINDS)
    for action in get_args(KeyAction):
        for outcome in KEY_COMMAND_OUTCOMES[action]:
            KEY_COMMANDS.labels(action, outcome)
    zero(UNAWAITED_RESULTS, ("result", "approval"))
    zero(TIMERS_FIRED, get_args(TimerKind))
    zero(TIMERS_SENT, get_args(TimerKind))
    zero(EFFECTOR_INTENTS, get_args(ToolStatus))
    zero(EFFECTOR_IN_DOUBT, IN_DOUBT_RESOLUTIONS)
    zero(BUFFERED_EVENTS_REJECTED, BUFFER_LIMITS)


def zero(counter: Counter, values: Iterable[str]) -> None:
    """Make ``counter``'s series for each of ``values`` exist (at 0 until counted)."""
    for value in values:
        counter.labels(value)


_topic_prefix = ""


def set_info(*, role: str, app_id: str, topic_prefix: str, version: str) -> None:
    """``keylane_info{role, app_id, topic_prefix, version} 1`` for this process."""
    INFO.labels(role, app_id, topic_prefix, version).set(1)


LabelledMetric = TypeVar("LabelledMetric", Counter, Gauge, Histogram)
_children: dict[tuple[Any, tuple[str, ...]], Any] = {}


def child(metric: LabelledMetric, *values: str) -> LabelledMetric:
    """``metric.labels(*values)``, looked up once per label set. The per-record paths (lanes,
    activations, model calls) ask for the same few series on every record, and ``labels``
    takes a lock and checks its arguments each time. Only for metrics whose series are never
    removed (consumer lag's are: it calls ``labels`` itself)."""
    where = (metric, values)
    found = _children.get(where)
    if found is None:
        found = _children[where] = metric.labels(*values)
    labelled: LabelledMetric = found
    return labelled


def use_topic_prefix(prefix: str) -> None:
    """Leave ``prefix`` out of every ``topic`` label from now on (see ``topic_label``); the app
    sets it when it is built, before any stage exports a topic's series."""
    global _topic_prefix
    _topic_prefix = prefix


def topic_label(topic: str) -> str:
    """A topic as its ``topic`` label shows it: without the process's topic prefix
    (``agent.events``, whatever the deployment's prefix), as the catalog names it; the prefix
    is ``keylane_info``'s ``topic_prefix``. Every metric labels its topics through this, so one
    query matches every deployment and the labels of one process agree."""
    return topic.removeprefix(_topic_prefix) if _topic_prefix else topic
