"""The payload codec's envelope, without a database: sealing, opening, errors, rotation."""

from __future__ import annotations

import json

import pytest

from selvedge_django import exceptions as exc
from selvedge_django.codecs import FernetCodec, fernet_key_id
from selvedge_django.engine.codec import (
    Codec,
    error_from_envelope,
    error_to_envelope,
    is_envelope,
)

OLD, NEW = FernetCodec.generate_key(), FernetCodec.generate_key()


def codec(*keys: str) -> Codec:
    return Codec(payload=FernetCodec(list(keys)))


def test_a_value_is_sealed_in_an_envelope_naming_codec_and_key_and_opens_again() -> None:
    value = {"name": "Ada", "amount": 12.5, "tags": ["x", None, True]}
    text = codec(OLD).encode(value)
    envelope = json.loads(text)
    assert is_envelope(envelope) and "Ada" not in text
    assert envelope["$codec"] == "fernet" and envelope["key"] == fernet_key_id(OLD)
    assert codec(NEW, OLD).decode(text) == value  # any configured key decrypts
    assert Codec().decode(json.dumps(value)) == value  # plain JSON still reads


def test_a_missing_key_or_codec_raises_payload_decode_error_naming_the_key() -> None:
    text = codec(OLD).encode("secret")
    for reader in (codec(NEW), Codec()):
        with pytest.raises(exc.PayloadDecodeError) as raised:
            reader.decode(text)
        assert raised.value.key_id == fernet_key_id(OLD)
        assert fernet_key_id(OLD) in str(raised.value)
    tampered = json.loads(text)
    tampered["data"] = tampered["data"][:-8] + "AAAAAAA="
    with pytest.raises(exc.PayloadDecodeError):
        codec(OLD).open(tampered)


def test_size_and_depth_limits_hold_on_the_json_before_the_codec() -> None:
    limited = Codec(max_bytes=10, payload=FernetCodec([OLD]))
    assert is_envelope(json.loads(limited.encode("x" * 8)))  # 10 bytes of JSON: allowed
    with pytest.raises(exc.PayloadTooLarge):
        limited.encode("x" * 9)


def test_an_error_keeps_its_type_clear_and_seals_message_details_and_traceback() -> None:
    sealer = codec(OLD)
    inner = exc.ApplicationError("card 4242 declined", type="Declined", details={"card": "4242"})
    error = exc.RetryExhaustedError("charge", 3, inner)
    text = json.dumps(error_to_envelope(error, codec=sealer))
    assert "4242" not in text and '"Declined"' in text and "RetryExhaustedError" in text
    rebuilt = error_from_envelope(json.loads(text), codec(NEW, OLD))
    assert isinstance(rebuilt, exc.RetryExhaustedError)
    assert isinstance(rebuilt.last_error, exc.ApplicationError)
    assert rebuilt.last_error.message == "card 4242 declined"
    assert rebuilt.last_error.details == {"card": "4242"}
    with pytest.raises(exc.PayloadDecodeError):
        error_from_envelope(json.loads(text), codec(NEW))


def test_reseal_moves_a_value_to_the_first_key_once() -> None:
    text = codec(OLD).encode({"a": 1})
    rotating = codec(NEW, OLD)
    again = rotating.reseal(text)
    assert again is not None and json.loads(again)["key"] == fernet_key_id(NEW)
    assert rotating.reseal(again) is None  # already under the first key
    assert codec(NEW).decode(again) == {"a": 1}


def test_fernet_codec_refuses_no_keys_and_keys_that_are_not_fernet_keys() -> None:
    with pytest.raises(ValueError, match="PAYLOAD_KEYS"):
        FernetCodec([])
    with pytest.raises(ValueError, match=r"PAYLOAD_KEYS'\]\[1\]"):
        FernetCodec([OLD, "too-short"])
    assert FernetCodec(lambda: [NEW, OLD]).key_ids == (fernet_key_id(NEW), fernet_key_id(OLD))


def test_a_compensation_error_opens_its_nested_errors() -> None:
    failed = exc.ApplicationError("refund to NL91ABNA0417164300 failed", type="Refund")
    cause = exc.ApplicationError("card 4242 declined", type="Declined")
    error = exc.CompensationError(cause, [failed])
    text = json.dumps(error_to_envelope(error, codec=codec(OLD)))
    assert "4242" not in text and "NL91" not in text
    rebuilt = error_from_envelope(json.loads(text), codec(OLD))
    assert isinstance(rebuilt, exc.CompensationError)
    assert isinstance(rebuilt.error, exc.ApplicationError)
    assert rebuilt.error.message == "card 4242 declined"
    assert [e.message for e in rebuilt.compensation_errors] == [failed.message]
