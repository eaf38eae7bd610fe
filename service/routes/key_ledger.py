"""Per key on a dataset: what its own releases cost (the ledger by key) and its quota.

The ledger by key: the dataset's owning custodian and admins see every key; an analyst that may see the
dataset sees its own row only (never another key's name or spend); clients get 403, as for every ledger
route (they submit no jobs). Quotas: the owning custodian and admins only."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response, status
from sqlalchemy import Engine

from control.budgets.datasets import PUBLIC_DEFAULT_DELTA, budget_or_none, finite, public_cap_refusal
from control.budgets.key_spend import KeySpend, key_spend
from control.budgets.quotas import clear_quota, quotas, set_quota
from control.errors import NotFound, SpecError
from control.schemas import LedgerKey, LedgerKeys, Message, QuotaPublic, QuotaUpdate
from control.store.keys import Principal, key_record
from service.http.auth import AUTH_RESPONSES, CustodianKey, require_role
from service.http.deps import EngineDep
from service.http.params import DatasetNamePath, KeyIdPath
from service.routes.datasets import visible_dataset

router = APIRouter(prefix="/datasets", tags=["budgets"], responses=AUTH_RESPONSES)

_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": Message}}

#: Whoever may read the ledger by key: the roles that submit or oversee jobs (a client gets 403).
LedgerByKeyReader = Annotated[Principal, Depends(require_role("analyst", "custodian", "admin"))]


@router.get("/{name}/ledger/keys", response_model=LedgerKeys, responses=_NOT_FOUND)
def ledger_keys(name: DatasetNamePath, engine: EngineDep, principal: LedgerByKeyReader) -> LedgerKeys:
    """Per key: its name, jobs, iterations charged and the epsilon of its own releases composed by the
    accountant at the dataset's delta (spent: charged; reserved: with its open reservations), and its
    quota. Custodian and admin: every key with a job or a quota on the dataset, in order of its first job;
    an analyst: its own row only."""
    analyst = principal.role == "analyst"
    visible_dataset(engine, principal, name, administer=not analyst)
    budget = budget_or_none(engine, name)
    if budget is None:
        return LedgerKeys(dataset=name, delta=None, keys=[])
    rows = key_spend(engine, name, budget.delta, key_id=principal.key_id if analyst else None)
    return LedgerKeys(dataset=name, delta=budget.delta, keys=[_ledger_key(row) for row in rows])


def _ledger_key(row: KeySpend) -> LedgerKey:
    return LedgerKey(
        key_id=row.key_id,
        key_name=row.key_name,
        jobs=row.jobs,
        iterations_charged=row.iterations_charged,
        epsilon_spent=finite(row.epsilon_spent),
        epsilon_reserved=finite(row.epsilon_reserved),
        quota_epsilon=row.quota,
    )


@router.get("/{name}/quotas", response_model=list[QuotaPublic], responses=_NOT_FOUND)
def list_quotas(name: DatasetNamePath, engine: EngineDep, principal: CustodianKey) -> list[QuotaPublic]:
    """Every key's quota on the dataset, with what the key has used of it."""
    visible_dataset(engine, principal, name, administer=True)
    if not quotas(engine, name):
        return []
    return [_quota_public(name, row) for row in _spend(engine, name) if row.quota is not None]


@router.put("/{name}/quotas/{key_id}", response_model=QuotaPublic, responses=_NOT_FOUND)
def put_quota(
    name: DatasetNamePath, key_id: KeyIdPath, body: QuotaUpdate, engine: EngineDep, principal: CustodianKey
) -> QuotaPublic:
    """Cap what this analyst key's own releases on the dataset may cost (composed at the dataset's
    delta): a job is admitted only if it fits both the dataset's budget and this quota. A quota below what
    the key has spent or reserved is kept: the key's next job is refused. A public dataset takes no quota
    (422), as it takes no budget cap."""
    dataset = visible_dataset(engine, principal, name, administer=True)
    _analyst_of(engine, key_id, name)
    if dataset.public:
        raise SpecError([(("epsilon",), public_cap_refusal(name))])
    set_quota(engine, name, key_id, body.epsilon)
    (row,) = _spend(engine, name, key_id)
    return _quota_public(name, row)


@router.delete("/{name}/quotas/{key_id}", status_code=status.HTTP_204_NO_CONTENT, responses=_NOT_FOUND)
def delete_quota(
    name: DatasetNamePath, key_id: KeyIdPath, engine: EngineDep, principal: CustodianKey
) -> Response:
    """Remove the key's quota: the dataset's budget alone bounds it again (204 also when it had none)."""
    visible_dataset(engine, principal, name, administer=True)
    _analyst_of(engine, key_id, name)
    clear_quota(engine, name, key_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


def _analyst_of(engine: Engine, key_id: str, dataset: str) -> None:
    """404 unless `key_id` is an analyst key that may submit to the dataset (only analysts submit)."""
    record = key_record(engine, key_id)
    if record is None or record["role"] != "analyst" or record["dataset"] not in (None, dataset):
        raise NotFound(f"no analyst key {key_id} may submit jobs to dataset {dataset}")


def _spend(engine: Engine, dataset: str, key_id: str | None = None) -> list[KeySpend]:
    budget = budget_or_none(engine, dataset)  # without one nothing was charged: 0 at any delta
    delta = budget.delta if budget is not None else PUBLIC_DEFAULT_DELTA
    return key_spend(engine, dataset, delta, key_id=key_id)


def _quota_public(dataset: str, row: KeySpend) -> QuotaPublic:
    assert row.quota is not None
    return QuotaPublic(
        dataset=dataset,
        key_id=row.key_id,
        key_name=row.key_name,
        epsilon=row.quota,
        epsilon_spent=finite(row.epsilon_spent),
        epsilon_reserved=finite(row.epsilon_reserved),
        epsilon_remaining=max(row.quota - row.epsilon_reserved, 0.0),
        warning=(
            f"key {row.key_id}'s quota {row.quota:g} on dataset {dataset} is at or below what the key has "
            f"spent or reserved there ({row.epsilon_reserved:.4g}): its next job will be refused"
        )
        if row.quota <= row.epsilon_reserved
        else None,
    )
