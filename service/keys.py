"""API keys: `vips_<keyid>_<secret>`, stored as the key id plus the sha256 of the whole key, never in clear.

Used by `POST /v1/keys` and by the server-side CLI (`vips admin create-key`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, get_args

from sqlalchemy import Engine, insert, select, update

from privacy_wall.sqlengine import reading
from service.models import api_keys

Role = Literal["admin", "custodian", "analyst", "client"]
ROLES: tuple[Role, ...] = get_args(Role)
#: Roles whose keys may carry a dataset scope.
SCOPED_ROLES: tuple[Role, ...] = ("custodian", "client")

PREFIX = "vips"
_KEY_ID_BYTES = 8  # 16 hex characters: no "_" inside, so the key splits unambiguously
_SECRET_BYTES = 32


class InvalidKeyRequest(ValueError):
    """A key cannot be created as asked (unknown role, a scope on a role that takes none)."""


@dataclass(frozen=True)
class Principal:
    """Who is calling: the key's id, role and optional dataset scope."""

    key_id: str
    role: Role
    dataset: str | None = None


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def split_key(key: str) -> str | None:
    """The key id of a well-formed key, or None."""
    prefix, sep, rest = key.partition("_")
    if prefix != PREFIX or not sep:
        return None
    key_id, sep, secret = rest.partition("_")
    if not sep or not secret or len(key_id) != 2 * _KEY_ID_BYTES:
        return None
    return key_id


def create_key(engine: Engine, role: str, dataset: str | None = None) -> tuple[str, str]:
    """Create a key and return (key id, key); the key is shown once and only its hash is stored."""
    if role not in ROLES:
        raise InvalidKeyRequest(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
    if dataset is not None and role not in SCOPED_ROLES:
        raise InvalidKeyRequest(f"only {' and '.join(SCOPED_ROLES)} keys take a dataset scope")
    if dataset is not None and not dataset:
        raise InvalidKeyRequest("the dataset scope must be a dataset name")
    key_id = secrets.token_hex(_KEY_ID_BYTES)
    key = f"{PREFIX}_{key_id}_{secrets.token_urlsafe(_SECRET_BYTES)}"
    with engine.begin() as conn:
        conn.execute(
            insert(api_keys).values(
                id=key_id,
                key_hash=hash_key(key),
                role=role,
                dataset=dataset,
                created_at=datetime.now(UTC),
                revoked=False,
            )
        )
    return key_id, key


def authenticate(engine: Engine, key: str) -> Principal | None:
    """The principal of a valid, unrevoked key, or None (the caller answers 401 without saying why)."""
    key_id = split_key(key)
    if key_id is None:
        return None
    with reading(engine) as conn:
        row = conn.execute(
            select(api_keys.c.key_hash, api_keys.c.role, api_keys.c.dataset, api_keys.c.revoked).where(
                api_keys.c.id == key_id
            )
        ).one_or_none()
    if row is None or row.revoked or row.role not in ROLES:
        return None
    if not hmac.compare_digest(row.key_hash, hash_key(key)):
        return None
    return Principal(key_id=key_id, role=row.role, dataset=row.dataset)


def revoke_key(engine: Engine, key_id: str) -> bool:
    """Revoke a key; returns whether it existed."""
    with engine.begin() as conn:
        return bool(
            conn.execute(update(api_keys).where(api_keys.c.id == key_id).values(revoked=True)).rowcount
        )
