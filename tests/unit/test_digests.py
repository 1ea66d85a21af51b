"""keylane.digests gives the digests hashlib gives: ids and replay-cache keys ever written
depend on it."""

from __future__ import annotations

import hashlib
import os

import pytest

from keylane import digests


@pytest.mark.parametrize("size", [0, 1, 55, 56, 64, 120, 1000, 100_000])
def test_sha1_and_sha256_are_hashlibs(size: int) -> None:
    data = os.urandom(size)
    assert digests.sha1(data).digest() == hashlib.sha1(data, usedforsecurity=False).digest()
    assert digests.sha256(data).hexdigest() == hashlib.sha256(data).hexdigest()
    incremental = digests.sha256()
    incremental.update(data[: size // 2])
    incremental.update(data[size // 2 :])
    assert incremental.hexdigest() == hashlib.sha256(data).hexdigest()


def test_the_builtin_implementations_are_the_ones_used_where_cpython_has_them() -> None:
    pytest.importorskip("_sha1")
    assert digests.sha1.__module__ == "_sha1"
    assert digests.sha256.__module__ in {"_sha256", "_sha2"}
