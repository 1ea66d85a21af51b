"""ActivationContext: what one activation of an agent can see and do.

Everything an activation changes is staged here and applied by the runtime only if the
agent returns normally within its timeout: memory writes, replay-cache inserts, intents,
approval requests. The step cursor ``step_index`` advances by one on every ``act``,
``request_approval`` and ``call_model`` (cache hits included), so a replay of the same
activation produces the same intent ids in the same order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from keylane import ids, metrics
from keylane.authoring.memory import Memory
from keylane.authoring.ratelimit import ProviderLimiter
from keylane.authoring.tools import ToolRegistry, ToolSpec, UnknownTool
from keylane.errors import KeylaneError
from keylane.llm.types import LlmRequest, LlmResponse, Provider, provider_name, request_scope, requested_model
from keylane.wire import Approval, ToolIntent, ToolResult


class NoProvider(KeylaneError):
    """ctx.call_model was used by an agent configured without a provider_factory."""


class BudgetExceeded(KeylaneError):
    """The activation spent more tokens than AgentConfig.max_tokens_per_activation allows."""


class ToolMisuse(KeylaneError):
    """A tool was used through the wrong door (a read-only tool via act, or the reverse)."""


class ResponseCache(Protocol):
    """What ``call_model`` needs of the key's replay cache: the runtime passes the key's
    staged LLM_CACHE cell (keylane.core.replay_cache.ReplayCache) and commits it with the
    activation. A call is named by its ``request_scope`` (keylane.llm.types)."""

    def lookup(self, scope: bytes, *, now_ms: int) -> LlmResponse | None:
        """The response this activation already got for the call ``scope`` names, or None."""
        ...

    def keep(self, scope: bytes, response: LlmResponse, *, now_ms: int) -> None:
        """Keep ``response`` for the call ``scope`` names."""
        ...


@dataclass
class StagedApproval:
    """An approval request staged by ``request_approval``."""

    intent: ToolIntent
    channel: str


@dataclass
class ActivationStats:
    """Time spent outside the runtime, for overhead = activation time - model - tools."""

    llm_s: float = 0.0
    tool_s: float = 0.0
    llm_calls: int = 0
    cache_hits: int = 0
    tokens: int = 0
    """Prompt + completion tokens of every answer this activation got, cache hits included."""
    tool_calls: int = 0


@dataclass(kw_only=True)
class ActivationContext:
    """The agent's view of one activation of one physical key."""

    event: bytes
    """The event's payload (b"" on a resume)."""
    entity_key: bytes
    """The physical key (``key#i`` behind ShardKeys)."""
    seq: int
    """The activation's seq: the key's committed-activation count, or the suspended one's."""
    snapshot: bytes = b""
    """On a resume: the bytes the suspending activation passed to Suspend."""
    resume_result: ToolResult | None = None
    resume_approval: Approval | None = None
    now_ms: int
    _step_index: int = 0
    _provider: Provider | None = None
    _cache: ResponseCache
    _tools: ToolRegistry
    _intent_ttl_ms: int
    _approval_channel: str
    _limiter: ProviderLimiter | None = None
    _token_budget: int | None = None
    _open_memory: Callable[[], Memory]
    _memory: Memory | None = None
    intents: list[ToolIntent] = field(default_factory=list)
    approvals: list[StagedApproval] = field(default_factory=list)
    stats: ActivationStats = field(default_factory=ActivationStats)

    @property
    def memory(self) -> Memory:
        """The key's working memory, staged for this activation's commit. Opened on first use:
        most activations never touch it, and the runtime then commits the key's memory as it
        was without staging a copy."""
        memory = self._memory
        if memory is None:
            memory = self._memory = self._open_memory()
        return memory

    @property
    def opened_memory(self) -> Memory | None:
        """``memory`` if this activation opened it, else None (the key's memory stays as it was)."""
        return self._memory

    @property
    def is_resume(self) -> bool:
        """True when a tool result or an approval resumed a suspended activation."""
        return self.resume_result is not None or self.resume_approval is not None

    @property
    def step_index(self) -> int:
        """The step cursor: the index the next act / request_approval / call_model gets."""
        return self._step_index

    async def call_model(self, request: LlmRequest) -> LlmResponse:
        """Ask the model, answering from the replay cache when this activation asked before.

        Every answer, cached or not, is charged to the activation's token budget; going over
        it raises BudgetExceeded.
        """
        self._step_index += 1
        # Taken now: the agent may change the request's messages once the call returns.
        scope = request_scope(request, entity_key=self.entity_key, seq=self.seq)
        cached = self._cache.lookup(scope, now_ms=self.now_ms)
        if cached is not None:
            self.stats.cache_hits += 1
            metrics.LLM_CACHE_HITS.inc()
            self._charge(cached)
            return cached
        if self._provider is None:
            raise NoProvider("this agent has no provider: pass AgentConfig(provider_factory=...)")
        started = time.perf_counter()
        if self._limiter is not None:
            waited = await self._limiter.acquire(self.entity_key)
            if waited:
                metrics.RATE_LIMIT_WAIT_SECONDS.observe(waited)
        provider, model = provider_name(self._provider), requested_model(self._provider, request)
        gen_ai = (metrics.GEN_AI_CHAT, provider, model)
        calling = time.perf_counter()
        error_type = ""
        try:
            response = await self._provider.complete(request)
        except Exception as exc:
            error_type = type(exc).__name__
            metrics.LLM_ERRORS.labels(error_type).inc()
            raise
        except BaseException as exc:  # cancelled (the activation's deadline): not a success either
            error_type = type(exc).__name__
            raise
        finally:
            ended = time.perf_counter()
            self.stats.llm_s += ended - started
            self.stats.llm_calls += 1
            metrics.LLM_CALLS.inc()
            metrics.LLM_SECONDS.observe(ended - started)
            metrics.child(metrics.GEN_AI_DURATION, *gen_ai, error_type).observe(ended - calling)
        if response.prompt_tokens or response.completion_tokens:
            metrics.child(metrics.GEN_AI_TOKENS, *gen_ai, "input").observe(response.prompt_tokens)
            metrics.child(metrics.GEN_AI_TOKENS, *gen_ai, "output").observe(response.completion_tokens)
        self._cache.keep(scope, response, now_ms=self.now_ms)
        self._charge(response)
        return response

    def _charge(self, response: LlmResponse) -> None:
        self.stats.tokens += response.prompt_tokens + response.completion_tokens
        self.check_budget()

    def check_budget(self) -> None:
        """Raise BudgetExceeded when the activation has spent more tokens than its budget."""
        if self._token_budget is not None and self.stats.tokens > self._token_budget:
            raise BudgetExceeded(
                f"activation used {self.stats.tokens} tokens, over its budget of {self._token_budget}"
                f" (max_tokens_per_activation) at step {self._step_index}"
            )

    def act(self, tool: str, args_json: str, *, ttl_ms: int | None = None) -> str:
        """Stage a side effect for the effector; returns its deterministic intent id.

        The intent is published only if the activation commits. Suspend to wait for its
        ToolResult, which resumes this agent with ``ctx.resume_result``.
        """
        self._refuse_read_only(tool)
        intent = self._stage(tool, args_json, ttl_ms)
        self.intents.append(intent)
        return intent.intent_id

    def request_approval(
        self, args_json: str, *, channel: str | None = None, ttl_ms: int | None = None
    ) -> str:
        """Stage a request for a human decision; returns its intent id. Suspend to wait for it."""
        intent = self._stage(channel or self._approval_channel, args_json, ttl_ms)
        self.approvals.append(StagedApproval(intent=intent, channel=channel or self._approval_channel))
        return intent.intent_id

    def tool_spec(self, name: str) -> ToolSpec:
        """The registered tool ``name`` (UnknownTool if the agent's registry has none)."""
        return self._tools.get(name)

    async def run_tool(self, name: str, args: Any) -> Any:
        """Run a read-only tool inline and return its result."""
        spec = self._tools.get(name)
        if spec.side_effect:
            raise ToolMisuse(f"tool {name!r} has side effects: stage it with ctx.act({name!r}, args_json)")
        started = time.perf_counter()
        try:
            return await spec.execute(args)
        finally:
            self.stats.tool_s += time.perf_counter() - started
            self.stats.tool_calls += 1

    def _refuse_read_only(self, tool: str) -> None:
        try:
            spec = self._tools.get(tool)
        except UnknownTool:
            return  # the effector owns the implementation; it rejects names it does not know
        if not spec.side_effect:
            raise ToolMisuse(f"tool {tool!r} is read-only: call it inline with ctx.run_tool({tool!r}, args)")

    def _stage(self, tool: str, args_json: str, ttl_ms: int | None) -> ToolIntent:
        # The key's state keeps the name as a str (a pending intent's tool), checked here as
        # the agent hands it in (keylane.core.state.seal).
        if not isinstance(tool, str):
            raise TypeError(f"a tool name or approval channel must be a str, got {type(tool).__name__}")
        if not isinstance(args_json, str):
            raise TypeError("args_json must be a JSON string")
        try:
            msgspec.json.decode(args_json)
        except msgspec.DecodeError as exc:
            raise ValueError(f"args_json for {tool!r} is not valid JSON: {exc}") from None
        ttl = self._intent_ttl_ms if ttl_ms is None else ttl_ms
        # A float would be written into state that never decodes again (intents are ints).
        if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl <= 0:
            raise ValueError(f"ttl_ms must be a positive whole number of milliseconds, got {ttl!r}")
        intent = ToolIntent(
            intent_id=ids.intent_id(self.entity_key, self.seq, self._step_index),
            entity_key=self.entity_key.decode(),
            seq=self.seq,
            step_index=self._step_index,
            tool=tool,
            args_json=args_json,
            created_at_ms=self.now_ms,
            expires_at_ms=self.now_ms + ttl,
        )
        self._step_index += 1
        return intent
