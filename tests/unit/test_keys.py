"""Physical shard keys: the hash assignment, unsharding, round robin, and ShardKeys.reshard."""

from __future__ import annotations

import hashlib

import pytest

from keylane.keys import ShardAssigner, shard_index, shard_key, unshard_key
from keylane.stages.shard_keys import ShardKeys
from keylane.wire import AgentEnvelope, MalformedRecord, decode, encode


def expected_index(payload: bytes, n: int) -> int:
    return int.from_bytes(hashlib.sha256(payload).digest()[:8], "big") % n


def test_hot_entity_with_payload_evt_a_lands_on_shard_1_of_4() -> None:
    assert shard_key(b"hot-entity", 4, payload=b"evt-a") == b"hot-entity#1"


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 16, 1000])
@pytest.mark.parametrize("payload", [b"", b"evt-a", b"evt-b", b'{"v":1,"payload":"hi"}', bytes(range(256))])
def test_shard_index_is_the_first_8_bytes_of_sha256_big_endian_mod_n(payload: bytes, n: int) -> None:
    assert shard_index(payload, n) == expected_index(payload, n)
    assert shard_key(b"k", n, payload=payload) == b"k#" + str(expected_index(payload, n)).encode()


def test_hash_assignment_spreads_distinct_payloads_over_all_shards() -> None:
    used = {shard_index(f"evt-{i}".encode(), 4) for i in range(200)}

    assert used == {0, 1, 2, 3}


def test_one_shard_still_suffixes_hash_0() -> None:
    assert shard_key(b"entity", 1, payload=b"anything") == b"entity#0"
    assert shard_key(b"entity", 1, payload=b"") == b"entity#0"


@pytest.mark.parametrize("n", [0, -1])
def test_fewer_than_one_shard_is_refused(n: int) -> None:
    with pytest.raises(ValueError, match="shard count must be >= 1"):
        shard_key(b"entity", n, payload=b"evt")
    with pytest.raises(ValueError, match="n >= 1"):
        ShardAssigner(n)


@pytest.mark.parametrize(
    ("physical", "logical"),
    [
        (b"hot-entity#1", b"hot-entity"),
        (b"a#1#2", b"a#1"),
        (b"order#12345", b"order"),
        (b"x#0", b"x"),
    ],
)
def test_unshard_strips_exactly_one_trailing_hash_digits(physical: bytes, logical: bytes) -> None:
    assert unshard_key(physical) == logical


@pytest.mark.parametrize("physical", [b"plain", b"x#", b"x#a", b"x#1a", b"x#\xd9\xa1"])
def test_unshard_refuses_a_key_without_a_shard_suffix(physical: bytes) -> None:
    with pytest.raises(ValueError, match="is not a shard key"):
        unshard_key(physical)


@pytest.mark.parametrize("n", [1, 3, 8])
def test_unshard_inverts_shard_key(n: int) -> None:
    for i in range(20):
        assert unshard_key(shard_key(b"tenant-9", n, payload=f"p{i}".encode())) == b"tenant-9"


def test_round_robin_cycles_through_every_shard_for_identical_payloads() -> None:
    assigner = ShardAssigner(3, assignment="round_robin")

    keys = [assigner.physical_key(b"hot", b"same bytes") for _ in range(7)]

    assert keys == [b"hot#0", b"hot#1", b"hot#2", b"hot#0", b"hot#1", b"hot#2", b"hot#0"]


def test_hash_assignment_puts_identical_payloads_on_one_shard() -> None:
    assigner = ShardAssigner(3)

    keys = {assigner.physical_key(b"hot", b"same bytes") for _ in range(7)}

    assert keys == {shard_key(b"hot", 3, payload=b"same bytes")}


def test_an_unknown_assignment_is_refused() -> None:
    with pytest.raises(ValueError, match="'hash' or 'round_robin'"):
        ShardAssigner(2, assignment="random")  # type: ignore[arg-type]


def test_reshard_rewrites_record_key_and_entity_key_to_the_same_physical_key() -> None:
    value = encode(AgentEnvelope(payload={"n": 1}, event_id="e-1"))

    physical, rewritten = ShardKeys(4).reshard(b"hot-entity", value)

    assert physical == shard_key(b"hot-entity", 4, payload=value)
    envelope = decode(rewritten, AgentEnvelope)
    assert envelope.entity_key == physical.decode()
    assert envelope.payload == {"n": 1}
    assert envelope.event_id == "e-1"


def test_reshard_accepts_an_envelope_already_naming_its_logical_key() -> None:
    value = encode(AgentEnvelope(payload="hi", entity_key="hot-entity"))

    physical, rewritten = ShardKeys(4).reshard(b"hot-entity", value)

    assert unshard_key(physical) == b"hot-entity"
    assert decode(rewritten, AgentEnvelope).entity_key == physical.decode()


def test_reshard_is_deterministic_for_a_redelivered_record() -> None:
    value = encode(AgentEnvelope(payload="same"))

    assert ShardKeys(8).reshard(b"k", value) == ShardKeys(8).reshard(b"k", value)


@pytest.mark.parametrize(
    ("key", "value", "detail"),
    [
        (b"k", b"not json", "not a valid AgentEnvelope"),
        (b"k", None, "no value"),
        (None, encode(AgentEnvelope(payload="x")), "no key"),
        (b"k", b'{"v":1,"payload_b64":"***"}', "payload_b64"),
        (b"k", b'{"v":2,"payload":"x"}', "unknown schema version 2"),
        (b"k", encode(AgentEnvelope(payload="x", entity_key="someone-else")), "differs from the record key"),
    ],
    ids=["garbage", "no-value", "no-key", "bad-base64", "future-version", "wrong-entity-key"],
)
def test_reshard_refuses_a_record_it_cannot_read(key: bytes | None, value: bytes | None, detail: str) -> None:
    with pytest.raises(MalformedRecord, match=detail):
        ShardKeys(4).reshard(key, value)


def test_a_record_without_v_is_version_1_as_keylane_writes_its_own() -> None:
    assert b'"v"' not in encode(AgentEnvelope(payload="x"))  # omitted as the default
    assert decode(b'{"payload":"x"}', AgentEnvelope).v == 1
    assert decode(b'{"v":1,"payload":"x"}', AgentEnvelope) == decode(b'{"payload":"x"}', AgentEnvelope)
