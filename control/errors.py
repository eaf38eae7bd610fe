"""The API's domain errors: each carries an HTTP status and a message with no data values (service.app
turns them into answers)."""

from __future__ import annotations

from collections.abc import Sequence

from control.schemas import BudgetRefusal, StorageRefusal

Loc = tuple[str | int, ...]


class ServiceError(Exception):
    """An error with an HTTP status and a message that carries no data values."""

    status_code = 500

    def __init__(self, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers  # extra response headers (a 429's Retry-After)


class NotFound(ServiceError):
    status_code = 404


class Conflict(ServiceError):
    status_code = 409


class Gone(ServiceError):
    """410: what was asked for existed and was deleted (a job's outputs)."""

    status_code = 410


class RateLimited(ServiceError):
    """429: a key is over one of its limits (queued jobs, pricing requests); retry after `retry_after` s."""

    status_code = 429

    def __init__(self, detail: str, retry_after: int) -> None:
        super().__init__(detail, {"Retry-After": str(retry_after)})
        self.retry_after = retry_after


class QueueUnavailable(ServiceError):
    status_code = 503


class AccountantBusy(ServiceError):
    """Every pricing slot stayed taken for the whole wait: 503, nothing was reserved."""

    status_code = 503


class BudgetRefused(Conflict):
    """The ledger cannot admit the job; carries the numbers of the 409 body."""

    def __init__(self, refusal: BudgetRefusal) -> None:
        super().__init__(refusal.detail)
        self.refusal = refusal


class StorageFull(Conflict):
    """A job whose estimated outputs would take its key past VIPS_MAX_KEY_STORED_MB; carries the 409 body."""

    def __init__(self, refusal: StorageRefusal) -> None:
        super().__init__(refusal.detail)
        self.refusal = refusal


class SpecError(ValueError):
    """A job spec that is well-typed but invalid for its dataset or the server: 422 naming the fields."""

    def __init__(self, errors: Sequence[tuple[Loc, str]]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, loc))}: {msg}" for loc, msg in errors))
        self.errors = list(errors)
