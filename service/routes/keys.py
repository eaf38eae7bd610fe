"""API keys (admins): create, list, revoke."""

from __future__ import annotations

from fastapi import APIRouter, status

from control.errors import NotFound, SpecError
from control.schemas import KeyCreate, KeyCreated, KeyPublic, Message
from control.store.keys import InvalidKeyRequest, create_key, key_record, list_keys, revoke_key
from service.http.auth import AUTH_RESPONSES, AdminKey
from service.http.deps import EngineDep
from service.http.params import KeyIdPath

router = APIRouter(prefix="/keys", tags=["keys"], responses=AUTH_RESPONSES)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=KeyCreated)
def new_key(request: KeyCreate, engine: EngineDep, _admin: AdminKey) -> KeyCreated:
    """Create a key; it is shown once in this answer and only its sha256 is stored.

    Analyst and client keys need a scope: `dataset` (one dataset, which need not exist yet) or
    `all_datasets: true`. With `expires_in_days` the key is refused (401) after that time. `name` is a
    label (not unique) shown with the key's jobs, in ledgers and on the dashboard.
    """
    try:
        key_id, key = create_key(
            engine,
            request.role,
            request.dataset,
            all_datasets=request.all_datasets,
            expires_in_days=request.expires_in_days,
            name=request.name,
        )
    except InvalidKeyRequest as exc:
        raise SpecError([((exc.field,), str(exc))]) from None
    record = key_record(engine, key_id)
    assert record is not None
    return KeyCreated(
        id=key_id,
        name=request.name,
        key=key,
        role=request.role,
        dataset=request.dataset,
        all_datasets=record["all_datasets"],
        expires_at=record["expires_at"],
    )


@router.get("", response_model=list[KeyPublic])
def keys(engine: EngineDep, _admin: AdminKey) -> list[KeyPublic]:
    """Every key: id, name, role, scope, creation, expiry and whether it was revoked (never the key or its
    hash), oldest first."""
    return [KeyPublic(**record) for record in list_keys(engine)]


@router.delete("/{key_id}", response_model=KeyPublic, responses={404: {"model": Message}})
def revoke(key_id: KeyIdPath, engine: EngineDep, _admin: AdminKey) -> KeyPublic:
    """Revoke a key: from now on it answers 401. Revoking a revoked key again changes nothing."""
    if not revoke_key(engine, key_id):
        raise NotFound(f"key {key_id} not found")
    record = key_record(engine, key_id)
    assert record is not None
    return KeyPublic(**record)
