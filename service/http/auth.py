"""Bearer-key authentication and the role rules.

Missing or invalid key: 401 with `WWW-Authenticate: Bearer`. A key of the wrong role: 403. Another
tenant's job or dataset: 404, the same answer as for one that does not exist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine

from control.rate_limits import KeyInFlight, KeyRateLimiter
from control.store.keys import Principal, Role, authenticate, held_key_state
from service.http.deps import EngineDep

#: Methods that only read: each costs a token of its key's read limit (VIPS_READ_RATE_PER_KEY).
READ_METHODS = frozenset({"GET", "HEAD"})

_bearer = HTTPBearer(auto_error=False, description="an API key: `Authorization: Bearer vips_<id>_<secret>`")


#: The 401 of a key that does not authenticate here: the same words whatever the reason (never a key
#: of this store, tampered, or a revoked or expired one presented without its whole secret), and nothing
#: about any other service or store. The holder of a revoked or expired key is told which
#: (refused_key_detail): only the secret's holder can present it.
UNKNOWN_KEY = (
    "API key unknown to this service: not a key of its store, or revoked or expired (a key works only "
    "with the service whose store made it: check VIPS_URL against the `vips up` or admin that gave it)"
)


def refused_key_detail(engine: Engine, key: str) -> str:
    """The 401's words: to the holder of a revoked or expired key (its whole secret matches), which it is
    and what to do; to any other key, UNKNOWN_KEY (control.store.keys.held_key_state)."""
    state = held_key_state(engine, key)
    if state is None:
        return UNKNOWN_KEY
    return f"this API key {state}: ask an admin of this service for a new one (vips admin create-key)"


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"})


@contextmanager
def read_slot(request: Request, principal: Principal) -> Iterator[None]:
    """Count a read (GET, HEAD) of this key against its rate (the app's `read_limiter`) and hold one of its
    in-flight reads (`reads_in_flight`) while the block runs, or raise RateLimited (429 with Retry-After).
    Counted after the key authenticates: nobody else can spend it. Writes have their own limits."""
    if request.method not in READ_METHODS:
        yield
        return
    limiter: KeyRateLimiter | None = getattr(request.app.state, "read_limiter", None)
    if limiter is not None:
        limiter.take(principal.key_id)
    in_flight: KeyInFlight | None = getattr(request.app.state, "reads_in_flight", None)
    if in_flight is None:
        yield
        return
    in_flight.enter(principal.key_id)
    try:
        yield
    finally:
        in_flight.leave(principal.key_id)


def current_key(
    request: Request,
    engine: EngineDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Iterator[Principal]:
    if credentials is None:
        raise _unauthorized("missing API key: send `Authorization: Bearer <key>`")
    principal = authenticate(engine, credentials.credentials)
    if principal is None:
        raise _unauthorized(refused_key_detail(engine, credentials.credentials))
    with read_slot(request, principal):
        yield principal


CurrentKey = Annotated[Principal, Depends(current_key)]

#: Documented on every authenticated router.
AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing API key, or one unknown to this service (invalid, revoked or expired)"},
    403: {"description": "this key's role may not do this"},
}


def _one_of(roles: tuple[Role, ...]) -> str:
    """ "analyst" or "one of analyst, custodian, admin"."""
    return roles[0] if len(roles) == 1 else f"one of {', '.join(roles)}"


def require_role(*roles: Role) -> Callable[[Principal], Principal]:
    """A dependency that admits keys of the given roles and answers 403 to the others."""

    def check(principal: CurrentKey) -> Principal:
        if principal.role not in roles:
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"this needs a key with role {_one_of(roles)}; this key's role is {principal.role}",
            )
        return principal

    return check


AdminKey = Annotated[Principal, Depends(require_role("admin"))]
AnalystKey = Annotated[Principal, Depends(require_role("analyst"))]
CustodianKey = Annotated[Principal, Depends(require_role("custodian", "admin"))]
JobReaderKey = Annotated[Principal, Depends(require_role("analyst", "client", "custodian", "admin"))]
JobCancellerKey = Annotated[Principal, Depends(require_role("analyst", "custodian", "admin"))]
ReleaseReaderKey = Annotated[Principal, Depends(require_role("analyst", "custodian", "admin"))]


# ---- scope rules (pure functions over rows, so they are easy to audit and test) -------------------------


def owns_dataset(principal: Principal, dataset: Any) -> bool:
    """May this key administer (budget, ledger) the dataset row? Admins: all; custodians: their own."""
    if principal.role == "admin":
        return True
    if principal.role != "custodian":
        return False
    return bool(dataset.owner == principal.key_id or dataset.name == principal.dataset)


def sees_dataset(principal: Principal, dataset: Any) -> bool:
    """May this key see the dataset's public metadata and budget? Custodians: their own; analysts and
    clients: the dataset of their scope, or every dataset if their key was made for all datasets."""
    if principal.role == "custodian":
        return owns_dataset(principal, dataset)
    if principal.role in ("analyst", "client"):
        return principal.dataset is None or principal.dataset == dataset.name
    return True


def sees_job(principal: Principal, job: Any, dataset: Any = None) -> bool:
    """May this key read the job? Analysts: their own; clients: their scope; custodians: the jobs on the
    datasets they own (`dataset` is the job's dataset row); admins: all."""
    if principal.role == "admin":
        return True
    if principal.role == "analyst":
        return bool(job.owner == principal.key_id)
    if principal.role == "client":
        return principal.dataset is None or principal.dataset == job.dataset
    if principal.role == "custodian":
        return dataset is not None and dataset.name == job.dataset and owns_dataset(principal, dataset)
    return False


def controls_job(principal: Principal, job: Any) -> bool:
    """May this key cancel the job? The analyst who owns it, or an admin."""
    return principal.role == "admin" or (principal.role == "analyst" and job.owner == principal.key_id)


def cancels_job(principal: Principal, job: Any, dataset: Any = None) -> bool:
    """May this key cancel the job? Whoever controls it, and the custodian of its dataset (`dataset` is the
    job's dataset row); never a client."""
    return controls_job(principal, job) or (
        principal.role == "custodian" and sees_job(principal, job, dataset)
    )


def reads_releases(principal: Principal, job: Any, dataset: Any = None) -> bool:
    """May this key read the job's per-iteration releases? Whoever controls it, and the custodian of its
    dataset."""
    return controls_job(principal, job) or (
        principal.role == "custodian" and sees_job(principal, job, dataset)
    )
