"""The dashboard at /ui: server-rendered pages (Jinja2), no script, nothing from another host.

Sign in with an API key (a form whose input is `api_key`); the session cookie is HttpOnly,
SameSite=Strict, Secure over https (as the trusted proxies report it: service.http.proxies) and expires
(service.ui.sessions). Every state-changing request, the sign-in included, must come from this site's
own pages (`cross_site`: Sec-Fetch-Site, Origin, Referer), and every form of a signed-in page also
carries the session's CSRF token. Each page reads through the API's own functions, so a key sees what it
sees over /v1.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Callable, Coroutine
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from pydantic import ValidationError
from sqlalchemy import Engine

from control.budgets.datasets import exhausted, load_dataset
from control.budgets.key_spend import key_spend
from control.errors import Conflict, NotFound, ServiceError, SpecError
from control.jobs.storage import human_bytes
from control.planning.admission import alone_by_pld
from control.planning.coverage import interval_note
from control.planning.schedules import job_scale
from control.schemas import BudgetPublic, BudgetUpdate
from control.settings import ServiceSettings
from control.store.keys import Principal, authenticate, held_key_state
from control.store.posteriors import posterior_bytes
from privacy_wall.accounting.calibration import epsilon
from privacy_wall.accounting.weak import WEAK_EPSILON
from privacy_wall.names import NAME_RULE, is_dataset_name
from service.http.auth import owns_dataset, read_slot, reads_releases, sees_dataset
from service.http.deps import EngineDep, SettingsDep
from service.http.params import JOB_ID_RULE, decimal_number, is_job_id
from service.routes.budgets import set_budget
from service.routes.datasets import list_datasets, show_dataset
from service.routes.job_outputs import job_posterior, posterior_response
from service.routes.job_reads import to_public, visible_job
from service.ui import convergence, views
from service.ui.sessions import COOKIE, UiSession, close_session, find_session, open_session
from service.ui.svg import inline as inline_svg


def _origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of a URL, the port made explicit; None if it names no http(s) origin."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80)


def cross_site(request: Request) -> str | None:
    """Why a state-changing request is not from this site's own pages, or None if nothing says so.

    Browsers mark where a request comes from with headers a page cannot set: Sec-Fetch-Site (over https
    and on localhost) must be same-origin (or none: typed by the user); Origin, or without it Referer,
    must be this service's own origin, as the request's Host and scheme (the scheme as a trusted proxy
    reports it) give it; "Origin: null" (a sandboxed or privacy-stripped sender) is refused. A request
    with none of them comes from no browser (curl, a script) and cannot have been forged by a page.
    """
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return "this request was sent from another site's page"
    own = _origin(str(request.base_url))
    origin = request.headers.get("origin")
    sender = origin if origin is not None else request.headers.get("referer")
    if sender is None:
        return None
    if _origin(sender) != own:
        return (
            "this request was not sent from this site's own page (its Origin is not this service's: "
            "behind a reverse proxy, pass the Host header through and list the proxy in "
            "VIPS_TRUSTED_PROXIES so its X-Forwarded-Proto is believed)"
        )
    return None


#: Methods that change nothing; every other request to /ui passes `cross_site` first.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class SameOriginRoute(APIRoute):
    """Every /ui route: a state-changing request from another site is refused (403) before its handler
    runs (nothing is read, no session is opened or closed, no cookie is set)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def same_origin_only(request: Request) -> Response:
            if request.method not in SAFE_METHODS:
                refused = cross_site(request)
                if refused is not None:
                    return _error(request, None, 403, refused)
            return await handler(request)

        return same_origin_only


router = APIRouter(prefix="/ui", include_in_schema=False, route_class=SameOriginRoute)

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")

#: How often a running job's page reloads: its convergence plot takes well under a second to redraw
#: (bench/dashboard.py), and one reload per job every few seconds costs the API little.
RUNNING_REFRESH_SECONDS = 5

#: How long a sign-in lasts.
SESSION_LIFETIME = timedelta(hours=8)

#: Pages run no script and load only from this host; plots are images (SVG) from here too.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; img-src 'self' data:; style-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    # same-origin: nothing to other hosts, while this site's own forms carry their true Origin (under
    # no-referrer a browser sends "Origin: null", which `cross_site` refuses)
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _epsilon(value: float | None) -> str:
    if value is None:
        return "-"
    return "unbounded" if math.isinf(value) else f"{value:.4g}"


def _held(budget: BudgetPublic) -> float:
    """In flight: what open reservations hold beyond the spend (reserved is spent plus in flight, as in
    BudgetPublic); 0 when both are unbounded."""
    if budget.epsilon_reserved == budget.epsilon_spent:
        return 0.0
    return max(budget.epsilon_reserved - budget.epsilon_spent, 0.0)


def _exhausted(budget: BudgetPublic | None) -> bool:
    """Is the budget's cap at or below its spend (control.budgets.datasets.exhausted)?"""
    return budget is not None and exhausted(budget.epsilon, budget.epsilon_spent)


templates.env.filters["eps"] = _epsilon
templates.env.filters["held"] = _held
templates.env.globals["weak_epsilon"] = f"{WEAK_EPSILON:g}"  # a cap above it needs the form's box
templates.env.tests["exhausted"] = _exhausted


def _svg(svg: bytes) -> Response:
    return Response(svg, media_type="image/svg+xml", headers=SECURITY_HEADERS)


class _SignIn(Exception):
    """No (valid) session: the page sends its visitor to the sign-in form."""


def _session(request: Request, engine: EngineDep) -> UiSession:
    session = find_session(engine, request.cookies.get(COOKIE))
    if session is None:
        raise _SignIn
    return session


def _page(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    response = templates.TemplateResponse(request, template, context, status_code=status_code)
    response.headers.update(SECURITY_HEADERS)
    return response


def _error(request: Request, session: UiSession | None, status: int, message: str) -> HTMLResponse:
    return _page(request, "error.html", status, session=session, status=status, message=message)


def _check_csrf(session: UiSession, token: str | None) -> bool:
    return token is not None and hmac.compare_digest(token.encode(), session.csrf_token.encode())


def _guarded(request: Request, engine: EngineDep, render: Any) -> Response:
    """Run a page: no session sends to sign-in; a service error (404 ...) is an error page."""
    try:
        session = _session(request, engine)
    except _SignIn:
        return RedirectResponse("/ui/signin", status_code=303)
    try:
        with read_slot(request, session.principal):  # a page view is a read of its key (429 beyond it)
            result: Response = render(session)
    except ServiceError as exc:
        page = _error(request, session, exc.status_code, exc.detail)
        page.headers.update(exc.headers or {})  # a 429's Retry-After
        return page
    return result


@router.get("/static/ui.css")
def stylesheet() -> FileResponse:
    return FileResponse(
        HERE / "static" / "ui.css", media_type="text/css", headers={"Cache-Control": "max-age=3600"}
    )


# ---- sign in and out ---------------------------------------------------------------------------------


@router.get("/signin", response_class=HTMLResponse)
def signin_form(request: Request) -> HTMLResponse:
    return _page(request, "signin.html", session=None, failed=False)


@router.post("/signin")
def signin(
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    api_key: Annotated[str, Form(max_length=256)] = "",
) -> Response:
    principal = authenticate(engine, api_key.strip())
    if principal is None:
        state = held_key_state(engine, api_key.strip())  # only the key's holder learns its state
        return _page(request, "signin.html", 401, session=None, failed=True, key_state=state)
    token, _ = open_session(engine, principal, SESSION_LIFETIME, max_sessions=settings.max_sessions_per_key)
    response = RedirectResponse("/ui", status_code=303)
    response.set_cookie(
        COOKIE,
        token,
        max_age=int(SESSION_LIFETIME.total_seconds()),
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/signout")
def signout(
    request: Request, engine: EngineDep, csrf_token: Annotated[str | None, Form()] = None
) -> Response:
    session = find_session(engine, request.cookies.get(COOKIE))
    if session is not None and not _check_csrf(session, csrf_token):
        return _error(request, session, 403, "this form is missing its CSRF token: reload the page and retry")
    close_session(engine, request.cookies.get(COOKIE))
    response = RedirectResponse("/ui/signin", status_code=303)
    response.delete_cookie(COOKIE, path="/ui")
    return response


# ---- datasets ----------------------------------------------------------------------------------------


@router.get("", response_class=HTMLResponse)
def datasets_page(
    request: Request, engine: EngineDep, page: Annotated[int, Query(ge=0, le=100_000)] = 0
) -> Response:
    def render(session: UiSession) -> Response:
        shown = list_datasets(engine, session.principal)
        bars = {d.name: views.remaining_fraction(d.budget) for d in shown}
        jobs = views.readable_jobs(engine, session.principal, page)
        return _page(
            request, "datasets.html", session=session, datasets=shown, bars=bars, jobs=jobs, pages_at="/ui"
        )

    return _guarded(request, engine, render)


def _dataset_name(name: str) -> str:
    """The path's dataset name if it follows the rule; otherwise a 404 that does not echo it (it never
    reaches the database: a path may be any length)."""
    if not is_dataset_name(name):
        raise NotFound(f"no such dataset: {NAME_RULE}")
    return name


def _dataset_context(engine: EngineDep, principal: Principal, name: str, page: int) -> dict[str, Any]:
    dataset = show_dataset(name, engine, principal)
    row = load_dataset(engine, name)
    assert row is not None
    administers = owns_dataset(principal, row)
    context: dict[str, Any] = {
        "dataset": dataset,
        "bar": views.remaining_fraction(dataset.budget),
        "administers": administers,
        "jobs": views.readable_jobs(engine, principal, page, name),
        "pages_at": f"/ui/datasets/{name}",
        # Who spent the budget: the custodian's and the admin's view only (GET .../ledger/keys).
        "spend_by_key": key_spend(engine, name, dataset.budget.delta)
        if administers and dataset.budget is not None
        else None,
        "spend_plot": _spend_svg(engine, principal, dataset),
    }
    return context


def _spend_svg(engine: Engine, principal: Principal, dataset: Any) -> Markup:
    """The spend plot as an element of the page (service.ui.svg.inline), so that each job's step shows
    its label on hover; the same drawing as /ui/datasets/NAME/epsilon.svg."""
    budget = dataset.budget
    delta = budget.delta if budget is not None else 1e-5
    drawing = views.spend_plot(engine, dataset.name, budget.epsilon if budget else None, delta, principal)
    label = (
        f"Cumulative epsilon spent on {dataset.name}, one point per job at its end, with the budget line; "
        "each job's step names the job and its key on hover"
    )
    return Markup(inline_svg(drawing, css_class="plot spend", label=label))  # our own drawing, escaped


@router.get("/datasets/{name}", response_class=HTMLResponse)
def dataset_page(
    request: Request, engine: EngineDep, name: str, page: Annotated[int, Query(ge=0, le=100_000)] = 0
) -> Response:
    def render(session: UiSession) -> Response:
        context = _dataset_context(engine, session.principal, _dataset_name(name), page)
        return _page(request, "dataset.html", session=session, problem=None, **context)

    return _guarded(request, engine, render)


@router.post("/datasets/{name}/budget", response_class=HTMLResponse)
def budget_form(
    request: Request,
    engine: EngineDep,
    name: str,
    epsilon: Annotated[str, Form(max_length=64)] = "",
    delta: Annotated[str, Form(max_length=64)] = "",
    weak_privacy_ok: Annotated[str, Form(max_length=8)] = "",
    csrf_token: Annotated[str | None, Form()] = None,
) -> Response:
    """The custodian's budget form: the checks and errors of PUT /v1/datasets/{name}/budget (an empty
    epsilon is no cap, which only a public dataset takes; a cap above epsilon 10 needs its box ticked)."""

    def render(session: UiSession) -> Response:
        if not _check_csrf(session, csrf_token):
            return _error(
                request, session, 403, "this form is missing its CSRF token: reload the page and retry"
            )
        row = load_dataset(engine, _dataset_name(name))
        if row is None or not owns_dataset(session.principal, row):
            if row is not None and sees_dataset(session.principal, row):
                return _error(
                    request, session, 403, f"only the custodian of {name} (or an admin) sets its budget"
                )
            raise NotFound(f"dataset {name} not found")
        try:
            update = BudgetUpdate.model_validate(
                {
                    "epsilon": _number("epsilon", epsilon) if epsilon.strip() else None,
                    "delta": _number("delta", delta),
                    "weak_privacy_ok": weak_privacy_ok == "on",
                }
            )
            set_budget(name, update, engine, session.principal)
        except (ValidationError, ValueError) as exc:
            return _with_problem(request, engine, session, name, 422, _problem(exc))
        except SpecError as exc:
            return _with_problem(request, engine, session, name, 422, "; ".join(msg for _, msg in exc.errors))
        except Conflict as exc:
            return _with_problem(request, engine, session, name, 409, exc.detail)
        return RedirectResponse(f"/ui/datasets/{name}", status_code=303)

    return _guarded(request, engine, render)


def _number(field: str, text: str) -> float:
    number = decimal_number(text)
    if number is None:
        raise ValueError(f"{field}: {text.strip()[:20]} is not a number")
    return number


def _problem(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    return str(exc)


def _with_problem(
    request: Request, engine: EngineDep, session: UiSession, name: str, status: int, problem: str
) -> HTMLResponse:
    context = _dataset_context(engine, session.principal, name, 0)
    return _page(request, "dataset.html", status, session=session, problem=problem, **context)


@router.get("/datasets/{name}/epsilon.svg")
def spend_plot(request: Request, engine: EngineDep, name: str) -> Response:
    def render(session: UiSession) -> Response:
        dataset = show_dataset(_dataset_name(name), engine, session.principal)
        budget = dataset.budget
        delta = budget.delta if budget is not None else 1e-5
        drawing = views.spend_plot(engine, name, budget.epsilon if budget else None, delta, session.principal)
        return _svg(drawing)

    return _guarded(request, engine, render)


# ---- jobs --------------------------------------------------------------------------------------------


def _job(engine: EngineDep, principal: Principal, job_id: str) -> tuple[Any, Any]:
    if not is_job_id(job_id):  # checked before any query, without echoing a path of any length
        raise NotFound(f"no such job: {JOB_ID_RULE}")
    job = visible_job(engine, principal, job_id)
    return job, load_dataset(engine, job.dataset)


def _small_posterior(engine: Engine, settings: ServiceSettings, job: Any) -> int | None:
    """The size of the job's posterior, which a page may load when it is within ui_posterior_max_mb; else
    None."""
    size = posterior_bytes(engine, job.id) if job.status == "succeeded" else None
    return size if size is not None and size <= settings.ui_posterior_max_mb * (1 << 20) else None


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, engine: EngineDep, settings: SettingsDep, job_id: str) -> Response:
    def render(session: UiSession) -> Response:
        job, dataset = _job(engine, session.principal, job_id)
        (public,) = to_public(engine, [job])
        summary, large, measured = None, None, True
        deleted = job.outputs_deleted_at is not None  # its record stays; nothing to plot or summarise
        if job.status == "succeeded" and not deleted:
            if _small_posterior(engine, settings, job) is not None:
                schema = dict(dataset.schema) if dataset is not None else {}
                document = job_posterior(engine, job)
                summary = views.summarize(document, schema)
                measured = _as_measured(job, document)
            else:
                large = human_bytes(posterior_bytes(engine, job.id) or 0)
        context = {
            "large_posterior": large,
            "summary_limit": human_bytes(settings.ui_posterior_max_mb * (1 << 20)),
            "job": public,
            "owner": job.owner,
            "releases": reads_releases(session.principal, job, dataset) and not deleted,
            "summary": summary,
            "running": job.status in ("queued", "running"),
            "refresh": RUNNING_REFRESH_SECONDS,
            "signal": convergence.signal_of(job.algorithm),
            "per_iteration": _per_iteration(job, dataset),
            "alone_by_pld": None
            if dataset is None
            else alone_by_pld(job.sigma, job.batch_size, dataset.population, job.iterations, job.delta),
            "interval_note": interval_note(
                job.model, job.algorithm, job.sigma > 0, job.options, _job_scale(job, dataset)
            )
            if measured
            else None,
            "timing": views.job_timing(public),
        }
        return _page(request, "job.html", session=session, **context)

    return _guarded(request, engine, render)


def _as_measured(job: Any, document: dict[str, Any]) -> bool:
    """Whether the posterior is of the kind control.planning.coverage's lines were measured on: VIPS's and
    DP-SEP's noise-aware logistic posteriors are widened along their last step (vips.models.blr.model), which
    one stored before that, without variational_parameters.last_step, was not."""
    if job.model != "blr" or job.algorithm not in ("vips", "dpsep") or job.options.get("noise_aware", 1) == 0:
        return True
    return "last_step" in (document.get("variational_parameters") or {})


def _job_scale(job: Any, dataset: Any) -> float:
    """The scale the job's rule read it at (control.planning.schedules.job_scale), from its epsilon, N and
    d; infinite without them (sigma given, or the dataset gone)."""
    if dataset is None or job.epsilon_target is None:
        return math.inf
    return job_scale(
        job.model,
        job.algorithm,
        int(dataset.population),
        float(job.epsilon_target),
        job.options,
        int(dataset.dimension),
    )


def _per_iteration(job: Any, dataset: Any) -> float | None:
    """Epsilon of one iteration on its own (every iteration of a job releases the same mechanism), at the
    job's delta by the configured accountant; None for a non-private job or an unknown population."""
    if job.sigma <= 0 or dataset is None:
        return None
    return epsilon(job.sigma, job.batch_size, dataset.population, 1, job.delta)


@router.get("/jobs/{job_id}/convergence.svg")
def convergence_plot(request: Request, engine: EngineDep, job_id: str) -> Response:
    def render(session: UiSession) -> Response:
        job, dataset = _job(engine, session.principal, job_id)
        if not reads_releases(session.principal, job, dataset):
            raise NotFound(f"job {job_id} has no releases this key may read")
        population = dataset.population if dataset is not None else job.batch_size
        return _svg(views.convergence_plot(engine, job, population))

    return _guarded(request, engine, render)


@router.get("/jobs/{job_id}/posterior.svg")
def posterior_plot(request: Request, engine: EngineDep, settings: SettingsDep, job_id: str) -> Response:
    from service.ui import plots

    def render(session: UiSession) -> Response:
        job, dataset = _job(engine, session.principal, job_id)
        if job.status == "succeeded" and _small_posterior(engine, settings, job) is None:
            raise NotFound(f"job {job_id}'s posterior is too large to plot here: download it")
        document = job_posterior(engine, job)
        schema = dict(dataset.schema) if dataset is not None else {}
        summary = views.summarize(document, schema)
        if summary.coefficients is not None:
            shown = sorted(summary.coefficients, key=lambda c: -abs(c.mean))[:25]
            svg = plots.coefficients(
                [c.name for c in shown],
                [c.mean for c in shown],
                [c.lower for c in shown],
                [c.upper for c in shown],
                f"The {len(shown)} largest coefficients of job {job.id[:8]}",
            )
        elif summary.model == "sbn" and summary.square_pixels:
            weights = document["W"]
            units = [[row[k] for row in weights] for k in range(len(weights[0]))]
            svg = plots.weight_images(units, f"Each hidden unit's weights over the pixels: job {job.id[:8]}")
        else:
            raise NotFound(f"job {job_id}'s posterior has no plot")
        return _svg(svg)

    return _guarded(request, engine, render)


@router.get("/jobs/{job_id}/posterior.json")
def posterior_download(request: Request, engine: EngineDep, job_id: str) -> Response:
    def render(session: UiSession) -> Response:
        job, _ = _job(engine, session.principal, job_id)
        attachment = f'attachment; filename="posterior-{job.id[:8]}.json"'
        return posterior_response(engine, job, {**SECURITY_HEADERS, "Content-Disposition": attachment})

    return _guarded(request, engine, render)
