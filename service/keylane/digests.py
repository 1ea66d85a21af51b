"""SHA-1 and SHA-256 for the few short inputs every activation hashes (its ids, its replay
cache key), from CPython's built-in implementations where the interpreter has them.

OpenSSL's are as fast on a warm CPU, but an activation mostly runs right after a model call,
its CPU idle for the call's whole wait, and there OpenSSL's path costs about three times the
built-in's: on the development machine a 120-byte SHA-256 took 32 µs against 12 µs after a
30 ms sleep, and 0.9 µs against 1.4 µs without one (bench: ``overhead_50ms``). Both give
the same digests (tests/unit/test_digests.py); where the built-in modules are missing, hashlib
answers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Protocol


class Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...
    def digest(self) -> bytes: ...
    def hexdigest(self) -> str: ...


Hash = Callable[..., Digest]


def _builtin(module: str, name: str) -> Hash | None:
    try:
        found: Hash = getattr(__import__(module), name)
    except (ImportError, AttributeError):
        return None
    return found


def _openssl_sha1(data: bytes = b"") -> Digest:
    return hashlib.sha1(data, usedforsecurity=False)  # names, does not protect


sha1: Hash = _builtin("_sha1", "sha1") or _openssl_sha1
sha256: Hash = _builtin("_sha2", "sha256") or _builtin("_sha256", "sha256") or hashlib.sha256
