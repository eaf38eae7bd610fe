"""A small typed client of the HTTP API (the `vips` client commands use it).

    client = VipsClient.from_env()            # VIPS_URL (default http://127.0.0.1:8000), VIPS_API_KEY
    job = client.submit_job(dataset="adult", model="blr", iterations=100, batch_size=500, epsilon=1.0)
    client.wait(job["id"]) document = client.posterior(job["id"])

Every method returns the decoded JSON and raises ApiError on a non-2xx answer (ApiConnectionError,
status 0, when the server cannot be reached).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from control.store.job_status import TERMINAL

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT_SECONDS = 60.0
#: How often `vips wait` and Client.wait poll a job (control.settings' read limit is sized for it).
POLL_SECONDS = 1.0
#: A read refused with 429 is sent again after its Retry-After (at most this many seconds, 1 s if the
#: answer names none), up to READ_RETRIES more times: the limit is per key, and a key's own burst (a
#: notebook listing jobs, a dashboard open beside a wait) should slow its reads, not fail them.
READ_RETRIES = 5
MAX_RETRY_AFTER_SECONDS = 30.0


class ApiError(Exception):
    """A non-2xx answer: its status, a readable detail, and the decoded body (None if not JSON)."""

    def __init__(self, status_code: int, detail: str, body: Any = None) -> None:
        super().__init__(f"{status_code}: {detail}" if status_code else detail)
        self.status_code = status_code
        self.detail = detail
        self.body = body


class ApiConnectionError(ApiError):
    """No HTTP answer at all (server down, wrong URL, timeout): status_code is 0."""

    def __init__(self, detail: str) -> None:
        super().__init__(0, detail)


class ApiTimeout(ApiConnectionError):
    """The service took the request but did not answer in time: it may still have acted on it."""


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _raise_unless_success(response: httpx.Response, body: Any) -> None:
    """ApiError for any status but 2xx, with the answer's readable detail and its decoded body."""
    if not response.is_success:
        raise ApiError(response.status_code, _detail(body, response.reason_phrase or "error"), body)


def _detail(body: Any, fallback: str) -> str:
    """FastAPI's `detail`: a message, or a list of validation errors rendered as `field: message`."""
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        parts = []
        for error in detail:
            if not isinstance(error, dict):
                continue
            loc = [str(p) for p in error.get("loc", []) if p not in ("body", "query", "path")]
            parts.append(f"{'.'.join(loc) or 'request'}: {error.get('msg', 'invalid')}")
        if parts:
            return "; ".join(parts)
    return fallback


def retry_after_seconds(response: httpx.Response) -> float:
    """The seconds a 429's Retry-After asks for (delay-seconds; 1 if absent or not a number), at most
    MAX_RETRY_AFTER_SECONDS."""
    try:
        seconds = float(response.headers.get("Retry-After", "1"))
    except ValueError:
        seconds = 1.0
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS) if seconds == seconds else 1.0


class VipsClient:
    """Mirrors the routes of /v1 and the health probes."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        http: httpx.Client | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._http = http if http is not None else httpx.Client(base_url=self.base_url, timeout=timeout)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> VipsClient:
        env = os.environ if environ is None else environ
        return cls(env.get("VIPS_URL") or DEFAULT_URL, env.get("VIPS_API_KEY") or None)

    @property
    def key_id(self) -> str | None:
        """The id of the key this client sends (control.store.keys.split_key), None without a well-formed
        one."""
        from control.store.keys import split_key  # not at import: the client needs no database code to start

        return None if self._api_key is None else split_key(self._api_key)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> VipsClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- transport --------------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        auth: bool = True,
        extra_headers: Mapping[str, str] | None = None,
    ) -> Any:
        return self._send(method, path, json=json, params=params, auth=auth, extra_headers=extra_headers)[0]

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        auth: bool = True,
        extra_headers: Mapping[str, str] | None = None,
    ) -> tuple[Any, httpx.Response]:
        """The decoded JSON body and the response; an ApiError for any status but 2xx. A read (GET, HEAD)
        refused with 429 waits for its Retry-After and is sent again (READ_RETRIES)."""
        # None, not {}: an empty mapping would replace a query the path carries (a Link to the next page)
        query = {k: v for k, v in (params or {}).items() if v is not None} or None
        retries = READ_RETRIES if method in ("GET", "HEAD") else 0
        for attempt in range(retries + 1):
            with self._transport_errors():
                response = self._http.request(
                    method, path, json=json, params=query, headers=self._headers(auth, extra_headers)
                )
            if response.status_code != 429 or attempt == retries:
                break
            time.sleep(retry_after_seconds(response))
        body = _json_or_none(response)
        _raise_unless_success(response, body)
        return body, response

    @contextmanager
    def _streamed(self, path: str) -> Iterator[httpx.Response]:
        """A GET whose body is read by the caller (iter_bytes); an ApiError for any status but 2xx."""
        with self._transport_errors(), self._http.stream("GET", path, headers=self._headers()) as response:
            if not response.is_success:
                response.read()
                _raise_unless_success(response, _json_or_none(response))
            yield response

    def _headers(self, auth: bool = True, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if auth:
            if not self._api_key:
                raise ApiError(401, "no API key: set VIPS_API_KEY")
            headers["Authorization"] = f"Bearer {self._api_key}"
        headers.update(extra or {})
        return headers

    @contextmanager
    def _transport_errors(self) -> Iterator[None]:
        """httpx's transport errors as ApiConnectionError / ApiTimeout, naming the service's URL."""
        try:
            yield
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ApiConnectionError(f"cannot reach the VIPS service at {self.base_url} ({exc})") from None
        except httpx.TimeoutException:
            raise ApiTimeout(
                f"the VIPS service at {self.base_url} did not answer within {self._http.timeout.read} s"
            ) from None
        except httpx.HTTPError as exc:
            raise ApiConnectionError(f"no answer from the VIPS service at {self.base_url} ({exc})") from None

    # ---- probes -------------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", "/healthz", auth=False)
        return result

    def ready(self) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", "/readyz", auth=False)
        return result

    # ---- datasets and budgets -------------------------------------------------------------------------

    def datasets(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._request("GET", "/v1/datasets")
        return result

    def dataset(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", f"/v1/datasets/{quote(name, safe='')}")
        return result

    def set_budget(
        self, name: str, epsilon: float | None, delta: float, *, weak_privacy_ok: bool = False
    ) -> dict[str, Any]:
        """Set the cap and delta; weak_privacy_ok confirms a cap above epsilon 10 (refused without it)."""
        body: dict[str, Any] = {"epsilon": epsilon, "delta": delta}
        if weak_privacy_ok:
            body["weak_privacy_ok"] = True
        result: dict[str, Any] = self._request(
            "PUT", f"/v1/datasets/{quote(name, safe='')}/budget", json=body
        )
        return result

    def ledger_page(
        self, name: str, *, limit: int | None = None, cursor: str | None = None
    ) -> dict[str, Any]:
        """One page of the ledger: {"dataset", "budget", "entries", "next_cursor"}."""
        params = {"limit": limit, "cursor": cursor}
        result: dict[str, Any] = self._request(
            "GET", f"/v1/datasets/{quote(name, safe='')}/ledger", params=params
        )
        return result

    def ledger(self, name: str, *, page_size: int = 1000) -> dict[str, Any]:
        """The whole ledger, every page followed: {"dataset", "budget" (as of the last page), "entries"}."""
        entries: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = self.ledger_page(name, limit=page_size, cursor=cursor)
            entries.extend(page["entries"])
            cursor = page.get("next_cursor")
            if not cursor:
                return {"dataset": page["dataset"], "budget": page["budget"], "entries": entries}

    def ledger_jobs(self, name: str) -> dict[str, Any]:
        """Per job on the dataset: status, iterations charged, epsilon spent at the dataset's delta."""
        result: dict[str, Any] = self._request("GET", f"/v1/datasets/{quote(name, safe='')}/ledger/jobs")
        return result

    def ledger_keys(self, name: str) -> dict[str, Any]:
        """Per key on the dataset: name, jobs, iterations charged, its own releases' epsilon composed, quota
        (an analyst: its own row only)."""
        result: dict[str, Any] = self._request("GET", f"/v1/datasets/{quote(name, safe='')}/ledger/keys")
        return result

    def quotas(self, name: str) -> list[dict[str, Any]]:
        """Every key's quota on the dataset, with what the key has used of it (custodian, admin)."""
        result: list[dict[str, Any]] = self._request("GET", f"/v1/datasets/{quote(name, safe='')}/quotas")
        return result

    def set_quota(self, name: str, key_id: str, epsilon: float) -> dict[str, Any]:
        """Cap what the key's own releases on the dataset may cost (custodian, admin)."""
        path = f"/v1/datasets/{quote(name, safe='')}/quotas/{quote(key_id, safe='')}"
        result: dict[str, Any] = self._request("PUT", path, json={"epsilon": epsilon})
        return result

    def clear_quota(self, name: str, key_id: str) -> None:
        """Remove the key's quota on the dataset: the dataset's budget alone bounds it again."""
        self._request("DELETE", f"/v1/datasets/{quote(name, safe='')}/quotas/{quote(key_id, safe='')}")

    # ---- jobs ---------------------------------------------------------------------------------------

    def submit_job(
        self,
        *,
        dataset: str,
        model: str,
        iterations: int | None = None,
        algorithm: str = "vips",
        batch_size: int | None = None,
        sigma: float | None = None,
        epsilon: float | None = None,
        options: Mapping[str, float] | None = None,
        dry_run: bool = False,
        idempotency_key: str | None = None,
        weak_privacy_ok: bool = False,
    ) -> dict[str, Any]:
        """The queued job (202), or with dry_run the quote (nothing reserved). Resending with the same
        `idempotency_key` returns the job it first created instead of submitting another. iterations and
        batch_size left None are chosen by the server for the job's epsilon (the quote's `schedule`)."""
        spec: dict[str, Any] = {
            "dataset": dataset,
            "model": model,
            "algorithm": algorithm,
            "options": dict(options or {}),
            "dry_run": dry_run,
        }
        given = (
            ("iterations", iterations),
            ("batch_size", batch_size),
            ("sigma", sigma),
            ("epsilon", epsilon),
        )
        for name, value in given:
            if value is not None:
                spec[name] = value
        if weak_privacy_ok:  # confirms an epsilon above 10 (privacy_wall.accounting.weak)
            spec["weak_privacy_ok"] = True
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        result: dict[str, Any] = self._request("POST", "/v1/jobs", json=spec, extra_headers=headers)
        return result

    def jobs(
        self,
        *,
        dataset: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
    ) -> list[dict[str, Any]]:
        params = {"dataset": dataset, "status": status, "limit": limit, "offset": offset}
        result: list[dict[str, Any]] = self._request("GET", "/v1/jobs", params=params)
        return result

    def job(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", f"/v1/jobs/{quote(job_id, safe='')}")
        return result

    def cancel(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("POST", f"/v1/jobs/{quote(job_id, safe='')}/cancel")
        return result

    def delete_outputs(self, job_id: str) -> dict[str, Any]:
        """Delete an ended job's releases and posterior (frees the key's storage); returns the job."""
        result: dict[str, Any] = self._request("DELETE", f"/v1/jobs/{quote(job_id, safe='')}/outputs")
        return result

    def posterior(self, job_id: str) -> dict[str, Any]:
        """The posterior document, parsed (save_posterior writes a large one to a file without parsing)."""
        result: dict[str, Any] = self._request("GET", f"/v1/jobs/{quote(job_id, safe='')}/posterior")
        return result

    def save_posterior(self, job_id: str, path: Path) -> int:
        """Stream the posterior document to `path` as the server sends it (never whole in memory), through a
        temporary file renamed over `path` once complete: a cut download leaves `path` as it was. Returns
        the bytes written."""
        tmp = path.with_name(path.name + ".tmp")
        written = 0
        try:
            route = f"/v1/jobs/{quote(job_id, safe='')}/posterior"
            with self._streamed(route) as response, tmp.open("wb") as file:  # a cut body: ApiConnectionError
                for chunk in response.iter_bytes():
                    file.write(chunk)
                    written += len(chunk)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
        return written

    def releases(self, job_id: str, *, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """The job's releases after iteration `after` (at most `limit`), in order, over as many pages as
        the server needs (iter_releases)."""
        return list(self.iter_releases(job_id, after=after, limit=limit))

    def iter_releases(
        self, job_id: str, *, after: int = 0, limit: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """The job's releases page by page, following each page's Link rel="next" (one page in memory)."""
        path: str | None = f"/v1/jobs/{quote(job_id, safe='')}/releases"
        params: dict[str, Any] | None = {"after": after, "limit": limit}
        while path is not None:
            page, response = self._send("GET", path, params=params)
            yield from page
            following = response.links.get("next", {}).get("url")
            # Resolved against the page's own URL (it may be relative: "?after=T").
            path, params = (None if following is None else str(response.url.join(following))), None

    def wait(
        self,
        job_id: str,
        *,
        interval: float = POLL_SECONDS,
        timeout: float | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll the job until it is succeeded, failed or cancelled; returns the final job.

        `on_progress` gets the job after every poll (e.g. to drive a progress bar). Raises TimeoutError
        after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if on_progress is not None:
                on_progress(job)
            if job["status"] in TERMINAL:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is still {job['status']} after {timeout} s")
            time.sleep(interval)

    # ---- keys ---------------------------------------------------------------------------------------

    def create_key(
        self,
        role: str,
        dataset: str | None = None,
        *,
        all_datasets: bool = False,
        expires_in_days: float | None = None,
        name: str | None = None,
    ) -> dict[str, Any]:
        """A new key (shown once). Analyst and client keys need `dataset` or `all_datasets=True`; `name`
        is an optional label (1-64 printable characters, not unique)."""
        body: dict[str, Any] = {"role": role, "dataset": dataset, "all_datasets": all_datasets}
        if expires_in_days is not None:
            body["expires_in_days"] = expires_in_days
        if name is not None:
            body["name"] = name
        result: dict[str, Any] = self._request("POST", "/v1/keys", json=body)
        return result

    def list_keys(self) -> list[dict[str, Any]]:
        """Every key's id, name, role, scope, creation, expiry and revocation (admins; never a hash)."""
        result: list[dict[str, Any]] = self._request("GET", "/v1/keys")
        return result

    def revoke_key(self, key_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("DELETE", f"/v1/keys/{quote(key_id, safe='')}")
        return result
