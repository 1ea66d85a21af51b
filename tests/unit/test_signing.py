"""HMAC signatures: what verifies, what does not, and how keys rotate."""

from __future__ import annotations

import pytest

from keylane.config import Settings
from keylane.errors import ConfigError
from keylane.signing import Keyring
from keylane.wire import Approval, ToolIntent

INTENT = ToolIntent(
    intent_id="i-1",
    entity_key="k#0",
    seq=3,
    step_index=1,
    tool="refund",
    args_json='{"amount": 5}',
    created_at_ms=1,
    expires_at_ms=2,
)


def test_a_signed_intent_verifies_and_names_its_key() -> None:
    ring = Keyring.parse("2026-11:new-secret,2026-10:old-secret")

    signed = ring.sign(INTENT)

    assert signed.key_id == "2026-11" and signed.signature
    assert ring.verify(signed) == "ok"
    assert ring.sign(INTENT) == signed, "deterministic: a replay signs byte-identically"


@pytest.mark.parametrize("field", ["args_json", "tool", "entity_key", "expires_at_ms"])
def test_changing_any_field_breaks_the_signature(field: str) -> None:
    ring = Keyring.parse("k1:secret")
    signed = ring.sign(INTENT)
    value = getattr(signed, field)
    tampered = type(signed)(
        **{
            **{f: getattr(signed, f) for f in signed.__struct_fields__},
            field: value + 1 if isinstance(value, int) else value + "x",
        }
    )

    assert ring.verify(tampered) == "bad_signature"


def test_rotation_old_keys_still_verify_new_records_use_the_first_key() -> None:
    old = Keyring.parse("2026-10:old-secret").sign(INTENT)
    rotated = Keyring.parse("2026-11:new-secret,2026-10:old-secret")
    retired = Keyring.parse("2026-11:new-secret")

    assert rotated.verify(old) == "ok"
    assert rotated.sign(INTENT).key_id == "2026-11"
    assert retired.verify(old) == "unknown_key"


def test_unsigned_and_wrong_secret() -> None:
    ring = Keyring.parse("k1:secret")
    forged = Keyring.parse("k1:guessed").sign(
        Approval(intent_id="i", entity_key="k", approved=True, approver="mallory")
    )

    assert ring.verify(INTENT) == "unsigned"
    assert ring.verify(forged) == "bad_signature"
    assert Keyring.parse("").sign(INTENT) == INTENT, "no keys: nothing to sign with"


def test_bad_configuration_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="keyid:secret"):
        Keyring.parse("no-separator")
    with pytest.raises(ConfigError, match="KEYLANE_INTENT_SIGNATURES=require needs keys"):
        Settings.from_env({"KEYLANE_INTENT_SIGNATURES": "require"})
    with pytest.raises(ConfigError, match="must be one of off, permissive, require"):
        Settings.from_env({"KEYLANE_APPROVAL_SIGNATURES": "strict"})
