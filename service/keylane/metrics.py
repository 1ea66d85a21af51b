"""Every Prometheus metric keylane exports, declared once.

Identities the tests hold (counted when a record is handed to the producer, so a
re-published outbox record counts again, exactly like the record it adds to the topic):

* ``keylane_intents_emitted_total`` == records on agent.intents;
* ``keylane_agent_errors_total`` + ``keylane_orphaned_results_total`` == records on agent.errors.

Labels are bounded: ``reason`` and ``detail`` come from fixed vocabularies, never from ids
or keys.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_MS_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
_BYTES_BUCKETS = (256, 1024, 4096, 16384, 65536, 262144, 524288, 786432, 1048576)
_TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536)

ACTIVATIONS = Counter("keylane_activations", "Committed activations (starts and resumes).", ["kind"])
LLM_CALLS = Counter("keylane_llm_calls", "Model calls that reached the provider.")
LLM_CACHE_HITS = Counter("keylane_llm_cache_hits", "Model calls answered by the replay cache.")
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
TIMERS_FIRED = Counter("keylane_timers_fired", "Due timer fires applied by a key's lane.", ["kind"])
TIMERS_IGNORED = Counter("keylane_timers_ignored", "Timer fires ignored as stale, early or duplicate.")
TIMERS_SENT = Counter("keylane_timers_sent", "Timer-fired commands sent by the scan.", ["kind"])

ACTIVATION_MS = Histogram(
    "keylane_activation_ms", "Wall time of one activation, model and tools included.", buckets=_MS_BUCKETS
)
OVERHEAD_MS = Histogram(
    "keylane_overhead_ms", "Activation wall time minus model and tool time.", buckets=_MS_BUCKETS
)
LLM_MS = Histogram("keylane_llm_ms", "Wall time of one provider call.", buckets=_MS_BUCKETS)
MEMORY_BYTES = Histogram(
    "keylane_memory_bytes", "Committed memory size per activation.", buckets=_BYTES_BUCKETS
)
RATE_LIMIT_WAIT_MS = Histogram(
    "keylane_rate_limit_wait_ms",
    "Time a provider call waited for its key's or the worker's rate limit.",
    buckets=_MS_BUCKETS,
)
TOKENS_PER_CALL = Histogram(
    "keylane_tokens_per_call",
    "Tokens per provider call (prompt + completion), as the provider reported them.",
    buckets=_TOKEN_BUCKETS,
)
PROMPT_TOKENS = Counter("keylane_prompt_tokens", "Prompt tokens the provider reported.")
COMPLETION_TOKENS = Counter("keylane_completion_tokens", "Completion tokens the provider reported.")
TOKENS = Counter("keylane_tokens", "Prompt + completion tokens the provider reported.")
LLM_ERRORS = Counter(
    "keylane_llm_errors", "Provider calls that failed after retries, by error class.", ["error"]
)
LLM_RETRIES = Counter("keylane_llm_retries", "Provider attempts retried, by error class.", ["error"])
LLM_BREAKER_OPEN = Gauge(
    "keylane_llm_breaker_open", "1 while the provider's circuit breaker is open or half-open, else 0."
)

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
LANE_WAIT_MS = Histogram(
    "keylane_lane_wait_ms", "Time a record waited for its lane before it ran.", buckets=_MS_BUCKETS
)

EFFECTOR_INTENTS = Counter(
    "keylane_effector_intents", "Intents the effector finished, by status.", ["status"]
)
EFFECTOR_EXECUTIONS = Counter("keylane_effector_executions", "Tool executions the effector started.")
EFFECTOR_REPUBLISHED = Counter(
    "keylane_effector_republished", "Intents already Done whose stored result was republished."
)

# The effector's in-doubt window (docs/effector.md).
EFFECTOR_IN_DOUBT = Counter(
    "keylane_effector_in_doubt",
    "Intents found claimed without an outcome after their lease (an attempt died mid-tool), "
    "by resolution: reconciled_done, reconciled_not_done, rerun, error, expired.",
    ["resolution"],
)

# Size discipline of a key's state: queued events and the whole blob (docs/runtime.md).
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
    "Encoded size of each key state the runtime commits (one changelog record).",
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
