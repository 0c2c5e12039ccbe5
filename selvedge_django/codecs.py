"""Payload codecs: stored values encrypted at rest (``SELVEDGE["PAYLOAD_CODEC"]``).

A codec turns the bytes of a value's JSON into other bytes and back
(``encode(data: bytes) -> bytes``, ``decode(data: bytes) -> bytes``) and names
itself and the key it encodes with (``codec_id``, ``key_id``); a codec that can
tell which keys it holds lists their ids in ``key_ids``, so a value under any
other key is refused before decryption is tried. The engine stores what a codec
returns in a JSON envelope, ``{"$codec": <codec_id>, "key": <key_id>, "data":
<base64>}`` (see :mod:`selvedge_django.engine.codec`), so each stored value says
how it was encoded and the columns and the history format stay JSON.

:class:`FernetCodec` is the codec shipped: Fernet (AES-128-CBC with HMAC-SHA256)
from the ``cryptography`` package, installed with the ``selvedge-django[crypto]``
extra. No cryptography is written here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

__all__ = [
    "FernetCodec",
    "PayloadCodec",
    "codec_setting",
    "fernet_key_id",
    "generate_key",
    "resolve_codecs",
    "resolve_payload_codec",
    "resolve_payloads",
]


@runtime_checkable
class PayloadCodec(Protocol):
    """What ``SELVEDGE["PAYLOAD_CODEC"]`` names: bytes in, bytes out, with names."""

    codec_id: str
    key_id: str

    def encode(self, data: bytes) -> bytes:
        """Return ``data`` encoded (encrypted) under the key ``key_id``."""
        ...

    def decode(self, data: bytes) -> bytes:
        """Return the bytes ``encode`` was given; raise any exception when it cannot."""
        ...


def fernet_key_id(key: str | bytes) -> str:
    """The public id of a Fernet key: the first 12 hex digits of its SHA-256.

    It names the key in envelopes, errors and logs without revealing it.
    """
    raw = key.encode("ascii") if isinstance(key, str) else bytes(key)
    return hashlib.sha256(raw.strip()).hexdigest()[:12]


def generate_key() -> str:
    """Return a new random Fernet key (URL-safe base64 text), for ``PAYLOAD_KEYS``."""
    fernet = _fernet_module()
    return str(fernet.Fernet.generate_key().decode("ascii"))


def _fernet_module() -> Any:
    try:
        from cryptography import fernet
    except ImportError as error:  # pragma: no cover - depends on the installation
        raise ImportError(
            "selvedge_django.codecs.FernetCodec needs the cryptography package: "
            "pip install 'selvedge-django[crypto]'"
        ) from error
    return fernet


Keys = Sequence[str | bytes] | Callable[[], Sequence[str | bytes]]


class FernetCodec:
    """Fernet encryption under ``SELVEDGE["PAYLOAD_KEYS"]``: the first key encrypts, all decrypt.

    ``keys`` is a list of Fernet keys (``FernetCodec.generate_key()``) or a callable
    returning one, called once when the settings are read (a secrets manager's
    lookup). A value is decrypted with the key its envelope names, so a key can
    be retired once ``runselvedge rotate-keys`` has re-encrypted what it encoded.
    Raises ``ValueError`` without keys or with a key that is not a Fernet key.
    """

    codec_id = "fernet"
    generate_key = staticmethod(generate_key)

    def __init__(self, keys: Keys | None = None) -> None:
        fernet = _fernet_module()
        listed = keys() if callable(keys) else keys
        if not listed or isinstance(listed, str | bytes):
            raise ValueError(
                "FernetCodec needs SELVEDGE['PAYLOAD_KEYS']: a non-empty list of Fernet keys"
                " (or a callable returning one)"
            )
        self._fernets: dict[str, Any] = {}
        for position, key in enumerate(listed):
            try:
                one = fernet.Fernet(key)
            except (ValueError, TypeError) as error:
                raise ValueError(
                    f"SELVEDGE['PAYLOAD_KEYS'][{position}] is not a Fernet key (32 bytes in"
                    f" URL-safe base64, as FernetCodec.generate_key() makes): {error}"
                ) from None
            self._fernets.setdefault(fernet_key_id(key), one)
        self.key_ids: tuple[str, ...] = tuple(self._fernets)
        self.key_id = self.key_ids[0]
        self._primary = self._fernets[self.key_id]
        self._invalid = fernet.InvalidToken

    def encode(self, data: bytes) -> bytes:
        """Encrypt ``data`` under the first key."""
        return bytes(self._primary.encrypt(data))

    def decode(self, data: bytes, key_id: str | None = None) -> bytes:
        """Decrypt ``data`` with the key ``key_id`` (any of the keys when it is None)."""
        if key_id is not None:
            one = self._fernets.get(key_id)
            if one is None:
                raise KeyError(key_id)
            return bytes(one.decrypt(data))
        for one in self._fernets.values():
            try:
                return bytes(one.decrypt(data))
            except self._invalid:
                continue
        raise ValueError("no key of PAYLOAD_KEYS decrypts this value")

    def __repr__(self) -> str:
        return f"FernetCodec(key_ids={list(self.key_ids)!r})"


# The codec that reads envelopes when PAYLOAD_KEYS is set without PAYLOAD_CODEC.
DEFAULT_PAYLOAD_CODEC = "selvedge_django.codecs.FernetCodec"


def resolve_payload_codec(codec: Any, keys: Any) -> Any:
    """``PAYLOAD_CODEC`` as a codec instance (None: no codec).

    A dotted path or a class is built with ``PAYLOAD_KEYS`` (without arguments when
    there are none); an instance is used as it is. A codec refusing its keys (none,
    or not keys of its kind) is ImproperlyConfigured.
    """
    if codec is None:
        return None
    if isinstance(codec, str):
        try:
            codec = import_string(codec)
        except ImportError as error:
            raise ImproperlyConfigured(
                f"SELVEDGE['PAYLOAD_CODEC'] {codec!r} cannot be imported: {error}"
            ) from error
    if isinstance(codec, type):
        try:
            codec = codec(keys) if keys is not None else codec()
        except ImportError as error:
            raise ImproperlyConfigured(f"SELVEDGE['PAYLOAD_CODEC']: {error}") from error
        except (TypeError, ValueError) as error:
            raise ImproperlyConfigured(f"SELVEDGE['PAYLOAD_CODEC']: {error}") from error
    if not (
        callable(getattr(codec, "encode", None))
        and callable(getattr(codec, "decode", None))
        and isinstance(getattr(codec, "codec_id", None), str)
        and isinstance(getattr(codec, "key_id", None), str)
    ):
        raise ImproperlyConfigured(
            "SELVEDGE['PAYLOAD_CODEC'] must name a payload codec (``encode(bytes) -> bytes``,"
            " ``decode(bytes) -> bytes``, ``codec_id`` and ``key_id``), such as"
            " 'selvedge_django.codecs.FernetCodec'"
        )
    return codec


def codec_setting(codec: Any, keys: Any) -> Any:
    """``PAYLOAD_CODEC`` as a setting again: the class of a codec built from ``keys``
    (so that other keys build another), else the codec itself."""
    return type(codec) if codec is not None and keys is not None else codec


def resolve_codecs(codec: Any, keys: Any) -> tuple[Any, Any]:
    """``(PAYLOAD_CODEC, the codec that opens envelopes)`` from the settings.

    With PAYLOAD_KEYS but no PAYLOAD_CODEC (a codec turned off), new values are
    stored as plain JSON and a :class:`FernetCodec` still opens the values stored
    while it was on.
    """
    payload = resolve_payload_codec(codec, keys)
    if payload is None and keys:
        return None, resolve_payload_codec(DEFAULT_PAYLOAD_CODEC, keys)
    return payload, payload


def resolve_payloads(raw: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """``(PAYLOAD_CONVERTER, PAYLOAD_CODEC, the codec that opens envelopes)`` resolved
    from the raw ``SELVEDGE`` settings; ImproperlyConfigured when one is wrong."""
    converter = raw["PAYLOAD_CONVERTER"]
    if isinstance(converter, str):
        try:
            converter = import_string(converter)
        except ImportError as error:
            raise ImproperlyConfigured(
                f"SELVEDGE['PAYLOAD_CONVERTER'] {converter!r} cannot be imported: {error}"
            ) from error
    if isinstance(converter, type):
        converter = converter()
    if converter is not None and not (
        callable(getattr(converter, "from_json", None))
        and isinstance(getattr(converter, "encoder", None), type)
    ):
        raise ImproperlyConfigured(
            "SELVEDGE['PAYLOAD_CONVERTER'] must name a payload converter (an object with an"
            " ``encoder`` class and a ``from_json(value, annotation)`` method), such as"
            " 'selvedge_django.converters.TypedConverter'"
        )
    return (converter, *resolve_codecs(raw["PAYLOAD_CODEC"], raw["PAYLOAD_KEYS"]))
