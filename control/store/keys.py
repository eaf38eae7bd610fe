"""API keys: `vips_<keyid>_<secret>`, stored as the key id plus the sha256 of the whole key, never in clear.

Used by `/v1/keys` and by the server-side CLI (`vips admin create-key|list-keys|revoke-key`).

Scopes: a custodian key names the dataset it answers for (which need not exist yet); it also owns the
datasets ingested with its key id as their owner (privacy_wall.data.ingest's `owner`). An analyst or client
key may name one dataset and then sees only that one; without a dataset it sees every dataset, so it is
created only when asked for explicitly (`all_datasets`). A key may expire: after `expires_at` it is
refused like a revoked one. A key may carry a name (`name`: 1-64 printable characters, not unique), a
label that is public inside the deployment: it is shown next to the key's jobs, in the ledger and on the
dashboard. Keys created before names existed have none.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, get_args

from sqlalchemy import Engine, insert, select, update

from control.store.models import api_keys
from control.store.timestamps import aware
from privacy_wall.sqlengine import reading

Role = Literal["admin", "custodian", "analyst", "client"]
ROLES: tuple[Role, ...] = get_args(Role)
#: Roles whose keys may carry a dataset scope.
SCOPED_ROLES: tuple[Role, ...] = ("custodian", "analyst", "client")
#: Roles whose unscoped keys see every dataset: they need an explicit `all_datasets`.
ALL_DATASETS_ROLES: tuple[Role, ...] = ("analyst", "client")
#: The longest expiry a key may be given (days).
MAX_EXPIRY_DAYS = 36_500
#: The longest key name (characters).
KEY_NAME_MAX_LENGTH = 64

PREFIX = "vips"
_KEY_ID_BYTES = 8  # 16 hex characters: no "_" inside, so the key splits unambiguously
_SECRET_BYTES = 32


class InvalidKeyRequest(ValueError):
    """A key cannot be created as asked (unknown role, a scope on a role that takes none, no scope chosen);
    `field` names the request field at fault."""

    def __init__(self, message: str, field: str = "dataset") -> None:
        super().__init__(message)
        self.field = field


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


def key_name_problem(name: str) -> str | None:
    """Why `name` is not a key name (1-KEY_NAME_MAX_LENGTH printable characters, no control or other
    Unicode category C character, no leading or trailing whitespace), or None when it is one."""
    if not name:
        return "a key name must not be empty"
    if len(name) > KEY_NAME_MAX_LENGTH:
        return f"a key name has at most {KEY_NAME_MAX_LENGTH} characters (this one has {len(name)})"
    if any(unicodedata.category(char).startswith("C") for char in name):
        return "a key name takes printable characters only (no control, format or unassigned characters)"
    if name != name.strip():
        return "a key name must not start or end with whitespace"
    return None


def expired(expires_at: datetime | None, now: datetime | None = None) -> bool:
    moment = aware(expires_at)
    return moment is not None and moment <= (now or datetime.now(UTC))


def create_key(
    engine: Engine,
    role: str,
    dataset: str | None = None,
    *,
    all_datasets: bool = False,
    expires_in_days: float | None = None,
    name: str | None = None,
) -> tuple[str, str]:
    """Create a key and return (key id, key); the key is shown once and only its hash is stored.

    Custodian keys need a `dataset`; analyst and client keys exactly one of `dataset` or `all_datasets`.
    `name` is an optional label (key_name_problem says which are refused).
    """
    if name is not None and (problem := key_name_problem(name)) is not None:
        raise InvalidKeyRequest(problem, "name")
    if role not in ROLES:
        raise InvalidKeyRequest(f"unknown role {role!r}; expected one of {', '.join(ROLES)}", "role")
    if dataset is not None and role not in SCOPED_ROLES:
        raise InvalidKeyRequest(f"only {', '.join(SCOPED_ROLES)} keys take a dataset scope")
    if dataset is not None and not dataset:
        raise InvalidKeyRequest("the dataset scope must be a dataset name")
    if all_datasets and role not in ALL_DATASETS_ROLES:
        raise InvalidKeyRequest(
            f"only {' and '.join(ALL_DATASETS_ROLES)} keys take --all-datasets", "all_datasets"
        )
    if all_datasets and dataset is not None:
        raise InvalidKeyRequest("give either --dataset NAME or --all-datasets, not both")
    if role == "custodian" and dataset is None:
        raise InvalidKeyRequest("custodian keys need --dataset NAME: the dataset they answer for", "dataset")
    if role in ALL_DATASETS_ROLES and dataset is None and not all_datasets:
        raise InvalidKeyRequest(
            f"{role} keys need a scope: --dataset NAME (one dataset) or --all-datasets (every dataset)"
        )
    expires_at = None
    if expires_in_days is not None:
        if not 0 < expires_in_days <= MAX_EXPIRY_DAYS:
            raise InvalidKeyRequest(
                f"the expiry must be > 0 and <= {MAX_EXPIRY_DAYS} days", "expires_in_days"
            )
        expires_at = datetime.now(UTC) + timedelta(days=expires_in_days)
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
                expires_at=expires_at,
                name=name,
            )
        )
    return key_id, key


def _held_row(engine: Engine, key: str) -> Any | None:
    """The stored row (id, role, dataset, revoked, expires_at) of the key whose whole secret this is, or
    None: an id this store never made, a malformed key or a wrong secret."""
    key_id = split_key(key)
    if key_id is None:
        return None
    columns = (api_keys.c.id, api_keys.c.key_hash, api_keys.c.role, api_keys.c.dataset)
    with reading(engine) as conn:
        row = conn.execute(
            select(*columns, api_keys.c.revoked, api_keys.c.expires_at).where(api_keys.c.id == key_id)
        ).one_or_none()
    if row is None or not hmac.compare_digest(row.key_hash, hash_key(key)):
        return None
    return row


def authenticate(engine: Engine, key: str) -> Principal | None:
    """The principal of a valid, unrevoked, unexpired key, or None (the caller's 401 tells only the key's
    holder why: held_key_state)."""
    row = _held_row(engine, key)
    if row is None or row.revoked or row.role not in ROLES or expired(row.expires_at):
        return None
    return Principal(key_id=row.id, role=row.role, dataset=row.dataset)


def held_key_state(engine: Engine, key: str) -> str | None:
    """Why a key its holder presents in full (its secret matches the stored hash) no longer works: "was
    revoked" or "expired at <time>"; None for any other key, which learns nothing (not whether its id
    exists). Only the key's own holder can tell its own state: nobody else has the secret."""
    row = _held_row(engine, key)
    if row is None:
        return None
    if row.revoked:
        return "was revoked"
    if expired(row.expires_at):
        return f"expired at {aware(row.expires_at).isoformat(timespec='seconds')}"
    return None


def revoke_key(engine: Engine, key_id: str) -> bool:
    """Revoke a key; returns whether it existed (revoking a revoked key again is harmless)."""
    with engine.begin() as conn:
        return bool(
            conn.execute(update(api_keys).where(api_keys.c.id == key_id).values(revoked=True)).rowcount
        )


def _key_record(row: Any, now: datetime) -> dict[str, Any]:
    return {
        "id": row.id,
        "name": row.name,
        "role": row.role,
        "dataset": row.dataset,
        "all_datasets": row.dataset is None and row.role in ALL_DATASETS_ROLES,
        "created_at": aware(row.created_at),
        "expires_at": aware(row.expires_at),
        "expired": expired(row.expires_at, now),
        "revoked": bool(row.revoked),
    }


_KEY_COLUMNS = (
    api_keys.c.id,
    api_keys.c.name,
    api_keys.c.role,
    api_keys.c.dataset,
    api_keys.c.created_at,
    api_keys.c.expires_at,
    api_keys.c.revoked,
)


def list_keys(engine: Engine) -> list[dict[str, Any]]:
    """Every key's id, name, role, scope, creation, expiry and revocation, oldest first; never its hash."""
    now = datetime.now(UTC)
    with reading(engine) as conn:
        rows = conn.execute(select(*_KEY_COLUMNS).order_by(api_keys.c.created_at, api_keys.c.id)).all()
    return [_key_record(row, now) for row in rows]


def key_record(engine: Engine, key_id: str) -> dict[str, Any] | None:
    """One key as list_keys shows it, or None."""
    with reading(engine) as conn:
        row = conn.execute(select(*_KEY_COLUMNS).where(api_keys.c.id == key_id)).one_or_none()
    return None if row is None else _key_record(row, datetime.now(UTC))


def key_names(engine: Engine, key_ids: Iterable[str]) -> dict[str, str | None]:
    """The name of each of these keys (None: a key without a name); ids of no key are left out."""
    wanted = sorted(set(key_ids))
    names: dict[str, str | None] = {}
    with reading(engine) as conn:
        for start in range(0, len(wanted), _NAMES_PER_QUERY):
            chunk = wanted[start : start + _NAMES_PER_QUERY]
            rows = conn.execute(select(api_keys.c.id, api_keys.c.name).where(api_keys.c.id.in_(chunk)))
            names.update({row.id: row.name for row in rows})
    return names


#: Key ids per query of key_names (well under every backend's limit on bound parameters).
_NAMES_PER_QUERY = 500
