"""HMAC-SHA256 signatures on intents and approvals, with key ids for rotation.

A signature covers the record's canonical JSON with ``signature`` unset and ``key_id`` set,
so changing any field (or the key id) breaks it. The keyring holds every key still trusted
(``KEYLANE_SIGNING_KEYS="2026-11:secret-b,2026-10:secret-a"``); the first one signs. To
rotate: add the new key first, deploy, then drop the old one once nothing signed with it is
in flight.

Verification modes (``KEYLANE_INTENT_SIGNATURES`` for the effector,
``KEYLANE_APPROVAL_SIGNATURES`` for the worker):

* ``off`` — nothing is checked;
* ``permissive`` — a bad or missing signature is logged and counted, the record is used;
* ``require`` — a bad or missing signature dead-letters the record (``unsigned_intent`` /
  ``unsigned_approval`` on agent.errors); an intent never runs, an approval never resumes.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

import msgspec

from keylane.errors import ConfigError

Mode = Literal["off", "permissive", "require"]
Verdict = Literal["ok", "unsigned", "unknown_key", "bad_signature"]
MODES: tuple[Mode, ...] = ("off", "permissive", "require")

Signed = TypeVar("Signed", bound=msgspec.Struct)


@dataclass(frozen=True)
class Keyring:
    """Trusted signing keys by id; ``signing_key_id`` signs new records."""

    keys: Mapping[str, bytes]
    signing_key_id: str | None = None

    @classmethod
    def parse(cls, spec: str) -> Keyring:
        """``"kid:secret[,kid:secret…]"``; the first key signs. An empty spec is no keys."""
        keys: dict[str, bytes] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key_id, sep, secret = part.partition(":")
            if not sep or not key_id or not secret:
                raise ConfigError("KEYLANE_SIGNING_KEYS must look like 'keyid:secret[,keyid:secret]'")
            keys[key_id] = secret.encode()
        return cls(keys=keys, signing_key_id=next(iter(keys), None))

    def sign(self, record: Signed) -> Signed:
        """A copy of ``record`` with ``key_id`` and ``signature`` set (unchanged without keys)."""
        if self.signing_key_id is None:
            return record
        unsigned = msgspec.structs.replace(record, key_id=self.signing_key_id, signature=None)
        return msgspec.structs.replace(unsigned, signature=self._mac(self.signing_key_id, unsigned))

    def verify(self, record: msgspec.Struct) -> Verdict:
        """Whether ``record`` carries a valid signature by a trusted key."""
        signature = getattr(record, "signature", None)
        key_id = getattr(record, "key_id", None)
        if not signature or not key_id:
            return "unsigned"
        if key_id not in self.keys:
            return "unknown_key"
        unsigned = msgspec.structs.replace(record, signature=None)
        # Bytes, not str: compare_digest raises TypeError on non-ASCII text, and a forged
        # record must be refused, never crash the record's lane.
        if not hmac.compare_digest(signature.encode(), self._mac(key_id, unsigned).encode()):
            return "bad_signature"
        return "ok"

    def _mac(self, key_id: str, unsigned: msgspec.Struct) -> str:
        body = msgspec.json.encode(unsigned, order="sorted")
        return hmac.new(self.keys[key_id], body, hashlib.sha256).hexdigest()


def parse_mode(value: str, variable: str) -> Mode:
    if value not in MODES:
        raise ConfigError(f"{variable}={value!r} must be one of off, permissive, require")
    return value
