"""Virtual keys: a client's bearer token is hashed and looked up; the plaintext is never kept."""

from __future__ import annotations

import hmac

from ember.gateway.config import GatewayConfig, KeyConfig, hash_key
from ember.gateway.errors import GatewayError
from ember.gateway.store import Store

ANONYMOUS = KeyConfig(name="anonymous", key_sha256="0" * 64, tenant="anonymous")


class KeyRing:
    """The configured keys by hash, plus revocations read from the shared store."""

    def __init__(self, config: GatewayConfig, store: Store) -> None:
        self._by_hash = {key.key_sha256: key for key in config.keys}
        self._is_required = config.requires_keys
        self._admin_sha256 = config.admin_key_sha256
        self._store = store

    async def authenticate(self, authorization: str | None, x_api_key: str | None = None) -> KeyConfig:
        """The key behind an `Authorization: Bearer ...` (or `x-api-key`) header; 401 otherwise."""
        if not self._is_required:
            return ANONYMOUS
        token = bearer_token(authorization) or x_api_key
        if not token:
            raise unauthorized("missing API key: send `Authorization: Bearer <virtual key>`")
        key = self._by_hash.get(hash_key(token))
        if key is None or await self._store.is_revoked(key.key_sha256):
            raise unauthorized("invalid or revoked API key")
        return key

    def check_admin(self, authorization: str | None) -> None:
        """Admin routes need the admin key configured as `admin_key_sha256`."""
        token = bearer_token(authorization)
        if not self._admin_sha256 or not token or not hmac.compare_digest(hash_key(token), self._admin_sha256):
            raise unauthorized("admin routes need the admin key (admin_key_sha256 in the config)")


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def unauthorized(message: str) -> GatewayError:
    return GatewayError(message, status_code=401, error_type="authentication_error", code="invalid_api_key")
