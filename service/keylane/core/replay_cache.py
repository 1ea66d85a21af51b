"""The per-key replay cache (the LLM_CACHE cell): a model call answered once per activation.

Entries are keyed by :func:`keylane.llm.types.cache_key`, which includes the physical key
and the activation's seq, so a hit means "this activation asked exactly this before": the
resume of a suspended activation, or a repeated request. Limits, applied on every put:

* at most 64 entries, least recently used evicted first (get and put both refresh);
* 6 h time to live from creation (an entry exactly 6 h old is still live);
* 100 KiB for the cell, counted as the sum of its entries' encoded sizes: least recently
  used entries are evicted while more than one remains and the cell is over; a single
  response that cannot fit even alone is stored digest-only (its sha256, no body), and a
  lookup treats it as a miss.

The runtime keeps the cell only while the key is suspended: an activation that completes
(or a suspension its HITL timer ends) commits an empty cell, since a cache key includes the
seq and no activation of a finished seq runs again (service/keylane/core/activation.py).

Each entry's size is computed once, when it is inserted, and the TTL scan runs only when
the oldest entry can have expired: a put costs the same with 1 or 64 entries in the cell.
A stored response's sha256 is worked out only when the cell is committed (``entries``): most
activations complete, and their cell is dropped. Its size counts a digest all the same: a
hex sha256 always takes 64 characters.

For the same reason ``call_model`` goes through ``lookup`` and ``keep``, which take a call's
``request_scope`` rather than its key: ``keep`` only notes the answer, and the put (the key's
sha256, the entry and its size, the limits) happens when the cell is read again or committed.
A lookup in a cell that holds nothing, the first call of an activation that did not suspend
before, is a miss without a key. An activation that completes never works either out.
"""

from __future__ import annotations

from keylane.cells import encoded_size
from keylane.core.state import CacheEntry
from keylane.digests import sha256
from keylane.llm.types import LlmResponse, cache_key_of

MAX_ENTRIES = 64
TTL_MS = 6 * 60 * 60 * 1000
MAX_BYTES = 100 * 1024
_DIGEST_DUE = "0" * 64
"""The digest of an entry put in this activation until ``entries`` works it out: as long as
a hex sha256, so the entry's size is its size with the real one."""


class ReplayCache:
    """A staged copy of one key's LLM_CACHE cell, most recently used last."""

    def __init__(self, entries: list[CacheEntry]) -> None:
        self._committed = entries
        self._loaded = False
        self._entries: dict[str, CacheEntry] = {}
        self._bytes = 0
        self._oldest_ms: int | None = None
        self.dirty = False
        self.took_responses = False
        """Whether a model's response went in (``put`` or ``keep``), as its provider built it."""
        self._kept: list[tuple[bytes, LlmResponse, int]] = []
        """(scope, response, now_ms) of each ``keep`` not yet put, in call order."""

    def lookup(self, scope: bytes, *, now_ms: int) -> LlmResponse | None:
        """``get`` for the call whose ``request_scope`` is ``scope``."""
        if not (self._kept or self._committed or self._entries):
            return None  # nothing to hit: no key needed
        return self.get(cache_key_of(scope), now_ms=now_ms)

    def keep(self, scope: bytes, response: LlmResponse, *, now_ms: int) -> None:
        """``put`` for the call whose ``request_scope`` is ``scope``, done when the cell is
        next read (``get``, ``lookup``) or committed (``entries``)."""
        self.took_responses = True
        self.dirty = True
        self._kept.append((scope, response, now_ms))

    def _put_kept(self) -> None:
        kept, self._kept = self._kept, []
        for scope, response, now_ms in kept:
            self.put(cache_key_of(scope), response, now_ms=now_ms)

    def _load(self) -> None:
        """Index the committed cell on first use: activations that never call a model skip it."""
        self._loaded = True
        for entry in self._committed:
            self._entries[entry.cache_key] = entry
            self._bytes += entry.size
            if self._oldest_ms is None or entry.created_ms < self._oldest_ms:
                self._oldest_ms = entry.created_ms

    def get(self, cache_key: str, *, now_ms: int) -> LlmResponse | None:
        """The cached response, or None on a miss (absent, expired or digest-only)."""
        if self._kept:
            self._put_kept()
        if not self._loaded:
            self._load()
        entry = self._entries.get(cache_key)
        if entry is None:
            return None
        if now_ms - entry.created_ms > TTL_MS:
            self._drop(cache_key)
            self.dirty = True
            return None
        self._entries[cache_key] = self._entries.pop(cache_key)  # most recently used
        self.dirty = True
        if entry.digest_only:
            return None
        return LlmResponse(
            response=entry.response,
            model_id=entry.model_id,
            prompt_tokens=entry.prompt_tokens,
            completion_tokens=entry.completion_tokens,
            cached=True,
        )

    def put(self, cache_key: str, response: LlmResponse, *, now_ms: int) -> None:
        """Insert or refresh an entry, then enforce TTL, count and size limits."""
        if not self._loaded:
            self._load()
        self.took_responses = True
        entry = _sized(
            CacheEntry(
                cache_key=cache_key,
                response=response.response,
                digest=_DIGEST_DUE,
                created_ms=now_ms,
                model_id=response.model_id,
                prompt_tokens=response.prompt_tokens,
                completion_tokens=response.completion_tokens,
            )
        )
        if entry.size > MAX_BYTES:
            entry = _sized(
                CacheEntry(
                    cache_key=cache_key,
                    response=b"",
                    digest=sha256(response.response).hexdigest(),
                    created_ms=now_ms,
                    digest_only=True,
                    model_id=entry.model_id,
                )
            )
        if cache_key in self._entries:
            self._drop(cache_key)
        self._entries[cache_key] = entry
        self._bytes += entry.size
        if self._oldest_ms is None or now_ms < self._oldest_ms:
            self._oldest_ms = now_ms
        if now_ms - self._oldest_ms > TTL_MS:
            for key in [k for k, e in self._entries.items() if now_ms - e.created_ms > TTL_MS]:
                self._drop(key)
            self._oldest_ms = min((e.created_ms for e in self._entries.values()), default=None)
        while len(self._entries) > MAX_ENTRIES:
            self._drop(next(iter(self._entries)))
        while len(self._entries) > 1 and self._bytes > MAX_BYTES:
            self._drop(next(iter(self._entries)))
        self.dirty = True

    def _drop(self, cache_key: str) -> None:
        self._bytes -= self._entries.pop(cache_key).size

    def entries(self) -> list[CacheEntry]:
        """The staged cell, least recently used first, as it is committed."""
        if self._kept:
            self._put_kept()
        if not self._loaded:
            return self._committed
        for entry in self._entries.values():
            if entry.digest is _DIGEST_DUE:
                entry.digest = sha256(entry.response).hexdigest()
        return list(self._entries.values())


def _sized(entry: CacheEntry) -> CacheEntry:
    entry.size = encoded_size(entry)
    return entry
