"""Encryption of secrets at rest (provider keys, Langfuse secret keys, webhook secrets).

Fernet (AES-128-CBC with HMAC-SHA256) from `cryptography`. The key is KEEL_ENCRYPTION_KEY (a Fernet
key: 32 url-safe base64 bytes); without it, one is derived from DJANGO_SECRET_KEY with HKDF, so a
development install works out of the box and production keeps one secret to guard. Rotating: put the
new key first in KEEL_ENCRYPTION_KEY and the old ones after it, comma-separated; values encrypted
with any of them still decrypt, and new values use the first.
"""

from __future__ import annotations

import base64
from functools import cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings


class DecryptionFailed(Exception):
    """The value was not encrypted with any configured key (or was tampered with)."""


def _derived_key(secret: str) -> bytes:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"keel-secrets-at-rest", info=b"fernet").derive(
        secret.encode()
    )
    return base64.urlsafe_b64encode(key)


@cache
def _fernet(keys: str, secret_key: str) -> MultiFernet:
    configured = [key.strip() for key in keys.split(",") if key.strip()]
    return MultiFernet([Fernet(key) for key in configured] or [Fernet(_derived_key(secret_key))])


def _current() -> MultiFernet:
    return _fernet(settings.KEEL_ENCRYPTION_KEY, settings.SECRET_KEY)


def encrypt(plaintext: str) -> str:
    return _current().encrypt(plaintext.encode()).decode()


def decrypt(token: str) -> str:
    try:
        return _current().decrypt(token.encode()).decode()
    except InvalidToken:
        raise DecryptionFailed("the stored secret cannot be decrypted with the configured keys") from None
