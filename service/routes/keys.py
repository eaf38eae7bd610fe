"""API keys (admins)."""

from __future__ import annotations

from fastapi import APIRouter, status

from service.auth import AUTH_RESPONSES, AdminKey
from service.deps import EngineDep
from service.jobs import SpecError
from service.keys import InvalidKeyRequest, create_key
from service.schemas import KeyCreate, KeyCreated

router = APIRouter(prefix="/keys", tags=["keys"], responses=AUTH_RESPONSES)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=KeyCreated)
def new_key(request: KeyCreate, engine: EngineDep, _admin: AdminKey) -> KeyCreated:
    """Create a key; it is shown once in this answer and only its sha256 is stored."""
    try:
        key_id, key = create_key(engine, request.role, request.dataset)
    except InvalidKeyRequest as exc:
        raise SpecError([(("dataset",), str(exc))]) from None
    return KeyCreated(id=key_id, key=key, role=request.role, dataset=request.dataset)
