"""Request and response schemas, in families per resource (Create / Update / Public / Quote ...)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, StringConstraints, field_validator

from control.store.job_status import JobStatus
from control.store.keys import KEY_NAME_MAX_LENGTH, Role, key_name_problem
from privacy_wall.accounting.sigma_range import sigma_problem
from privacy_wall.accounting.weak import WEAK_EPSILON
from privacy_wall.names import NAME_MAX_LENGTH, NAME_REGEX
from vips.models.catalog import MODELS
from vips.models.spec import ALGORITHMS

#: The largest integer a request may carry: every integer column (SQLite and PostgreSQL) holds it.
INT_MAX = 2**31 - 1

#: The contract's names, spelled out for the OpenAPI document and the type checker; they are the models'
#: facts (vips.models.catalog), which tests/test_api_docs.py checks they equal.
Model = Literal["blr", "linreg", "lda", "sbn"]
Algorithm = Literal["vips", "dpvi", "dpsep"]
DatasetKind = Literal["tabular", "regression", "bow", "binary"]

#: Models and algorithms that run today; the others are part of the contract but answer 422.
AVAILABLE_MODELS: tuple[str, ...] = tuple(MODELS)
AVAILABLE_ALGORITHMS: tuple[str, ...] = ALGORITHMS

#: Request numbers are strict: JSON numbers only (no "2", no true); a float field takes 1 as well as 1.0.
FiniteFloat = Annotated[float, Field(strict=True, allow_inf_nan=False)]


def _finite_or_null(value: float) -> float | None:
    return value if math.isfinite(value) else None


#: An epsilon that may be unbounded (infinite: a sigma-0 job's charges on a public dataset). The model
#: keeps the float; JSON, which has no infinity, gets null, and the response schema says number or null.
MaybeInfinite = Annotated[float, PlainSerializer(_finite_or_null, return_type=float | None, when_used="json")]
#: Appended to the description of a MaybeInfinite field.
NULL_UNBOUNDED = "; null when unbounded (infinite: the charges of a sigma-0 job on a public dataset)"
#: The dataset name rule (privacy_wall.names) in bodies (service.http.params has it for paths and queries).
DatasetName = Annotated[str, StringConstraints(min_length=1, max_length=NAME_MAX_LENGTH, pattern=NAME_REGEX)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- health -------------------------------------------------------------------------------------------


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str] = Field(description='"ok" or what failed, per check (database, broker)')


# ---- budgets and the ledger ---------------------------------------------------------------------------


class BudgetUpdate(_Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"epsilon": 1.0, "delta": 1e-5}]},
    )

    epsilon: FiniteFloat | None = Field(
        gt=0, description="the epsilon cap; null (no cap) only for datasets marked public"
    )
    delta: FiniteFloat = Field(
        gt=0,
        lt=1,
        description="below 1/N of a private dataset (N its record count); delta << 1/N is the usual choice",
    )
    weak_privacy_ok: bool = Field(
        default=False,
        description=f"true to confirm a cap above epsilon {WEAK_EPSILON:g}, which protects little (refused "
        "without it)",
    )


class BudgetPublic(BaseModel):
    epsilon: float | None = Field(description="the cap; null means no cap (public datasets)")
    delta: float
    epsilon_spent: MaybeInfinite = Field(
        description="committed releases, at the dataset's delta" + NULL_UNBOUNDED
    )
    epsilon_reserved: MaybeInfinite = Field(
        description="spent plus in flight: the committed releases and what the open reservations of "
        "running and queued jobs may still spend, composed at the dataset's delta (never below "
        "epsilon_spent; equal to it when no job is in flight)" + NULL_UNBOUNDED
    )
    epsilon_remaining: float | None = Field(description="cap minus reserved, at least 0; null without a cap")


class BudgetSet(BudgetPublic):
    """The answer of PUT budget: the new budget, with a warning when the cap is at or below the spend."""

    warning: str | None = Field(
        default=None,
        description="set when the new cap is at or below the epsilon already spent: no job can be "
        "admitted until it is raised; null otherwise",
    )


class LedgerEntry(BaseModel):
    id: int = Field(description="the charge's id: entries are in increasing id order")
    job_id: str
    iteration: int
    attempt: int
    event: dict[str, Any]
    accountant: str
    created_at: datetime
    released: bool | None = Field(
        default=None,
        description="whether the release this charge paid for was kept: false when it never left the wall "
        "(the job was killed between charge and store, or a later attempt of the iteration replaced it; the "
        "charge stays, over-counting, never under-counting); null while the job may still keep it",
    )


class LedgerPublic(BaseModel):
    """One page of the audit log, oldest entry first."""

    dataset: str
    budget: BudgetPublic | None = Field(description="null until the custodian sets a budget")
    entries: list[LedgerEntry]
    next_cursor: str | None = Field(
        description="pass as `cursor` for the next page; null on the last page (opaque)"
    )


class LedgerJob(BaseModel):
    job_id: str
    key_name: str | None = Field(
        description="the name of the key that submitted the job; null when that key has none or the "
        "service has no row of the job"
    )
    status: JobStatus | None = Field(description="null for charges of a job the service has no row of")
    iterations_charged: int = Field(description="distinct iterations charged")
    charges: int = Field(description="charged releases (a retried attempt of an iteration counts again)")
    epsilon_spent: float | None = Field(
        description="this job's charges on their own, at the dataset's delta; null when unbounded"
    )


class LedgerJobs(BaseModel):
    """Per job on a dataset: what it has been charged (the ledger's entries summed per job)."""

    dataset: str
    delta: float | None = Field(description="the dataset's delta; null until a budget is set")
    jobs: list[LedgerJob]


class LedgerKey(BaseModel):
    key_id: str
    key_name: str | None = Field(description="the key's name; null when it has none")
    jobs: int = Field(description="jobs the key submitted on the dataset, in any state")
    iterations_charged: int = Field(description="distinct iterations charged over those jobs")
    epsilon_spent: float | None = Field(
        description="the key's own charged releases composed by the accountant at the dataset's delta "
        "(not the sum of its jobs' epsilons); null when unbounded"
    )
    epsilon_reserved: float | None = Field(
        description="its charges plus the uncommitted rest of its open reservations, composed the same way "
        "(what its quota bounds); null when unbounded"
    )
    quota_epsilon: float | None = Field(description="the key's quota on the dataset; null when it has none")


class LedgerKeys(BaseModel):
    """Per key on a dataset: what its own releases cost (custodian and admin: every key with a job or a
    quota there; an analyst: its own row only)."""

    dataset: str
    delta: float | None = Field(description="the dataset's delta; null until a budget is set")
    keys: list[LedgerKey]


class QuotaUpdate(_Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"epsilon": 0.2}]})

    epsilon: FiniteFloat = Field(
        gt=0,
        description="the most the key's own releases on the dataset may cost, composed at its delta",
    )


class QuotaPublic(BaseModel):
    """A key's quota on a dataset, with what the key has used of it."""

    dataset: str
    key_id: str
    key_name: str | None
    epsilon: float = Field(description="the quota")
    epsilon_spent: float | None = Field(
        description="the key's charged releases composed; null when unbounded"
    )
    epsilon_reserved: float | None = Field(
        description="charged plus open reservations, composed (what the quota bounds); null when unbounded"
    )
    epsilon_remaining: float = Field(description="the quota minus epsilon_reserved (at least 0)")
    warning: str | None = Field(
        default=None,
        description="set when the quota is at or below what the key has reserved: its next job is refused",
    )


# ---- datasets -----------------------------------------------------------------------------------------


class DatasetPublic(BaseModel):
    name: str
    kind: str
    population: int = Field(description="N, public by the custodian's declaration")
    dimension: int
    public: bool = Field(description="marked non-sensitive by the custodian (sigma 0 allowed)")
    created_at: datetime
    budget: BudgetPublic | None = Field(description="null until the custodian sets a budget")


class DatasetDetail(DatasetPublic):
    data_schema: dict[str, Any] = Field(
        serialization_alias="schema", description="column names or the vocabulary: public metadata"
    )


# ---- jobs ---------------------------------------------------------------------------------------------


class JobCreate(_Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"dataset": "adult", "model": "blr", "epsilon": 0.8},
                {"dataset": "adult", "model": "blr", "iterations": 10, "epsilon": 0.8},
                {"dataset": "adult", "model": "blr", "algorithm": "dpvi", "iterations": 500,
                 "batch_size": 650, "epsilon": 1.0},
                {"dataset": "docs", "model": "lda", "iterations": 20, "batch_size": 200, "epsilon": 2.4,
                 "options": {"topics": 20, "doc_length": 100}},
                {"dataset": "adult", "model": "blr", "iterations": 10, "epsilon": 0.8, "dry_run": True},
            ]
        },
    )  # fmt: skip

    dataset: DatasetName
    model: Model
    algorithm: Algorithm = "vips"
    iterations: int | None = Field(
        default=None,
        strict=True,
        ge=1,
        le=INT_MAX,
        description="T, at most the server's max_iterations; omitted: chosen for the job's epsilon (the "
        "quote's `schedule` says how; docs/schedules.md), or 10 when sigma is given",
    )
    batch_size: int | None = Field(
        default=None,
        strict=True,
        ge=1,
        le=INT_MAX,
        description="S, 1..N; omitted: chosen for the job's epsilon as iterations are (N with sigma)",
    )
    sigma: FiniteFloat | None = Field(
        default=None,
        ge=0,
        description="noise multiplier: 0 (public datasets only) or at least 0.001; give sigma or epsilon",
    )
    epsilon: FiniteFloat | None = Field(
        default=None, gt=0, description="target epsilon of this job on its own; the server solves for sigma"
    )
    options: dict[str, FiniteFloat] = Field(default_factory=dict)
    weak_privacy_ok: bool = Field(
        default=False,
        description=f"true to confirm a job on a private dataset whose epsilon (asked, or its cost when "
        f"sigma is given) is above {WEAK_EPSILON:g}, which protects little (refused without it)",
    )
    dry_run: bool = Field(
        default=False, strict=True, description="quote the cost without reserving or queueing anything"
    )

    @field_validator("sigma")
    @classmethod
    def _sigma_runnable(cls, value: float | None) -> float | None:
        problem = None if value is None else sigma_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("model")
    @classmethod
    def _model_available(cls, value: str) -> str:
        if value not in AVAILABLE_MODELS:
            raise ValueError(
                f"model {value!r} is not available yet (available: {', '.join(AVAILABLE_MODELS)})"
            )
        return value

    @field_validator("algorithm")
    @classmethod
    def _algorithm_available(cls, value: str) -> str:
        if value not in AVAILABLE_ALGORITHMS:
            raise ValueError(
                f"algorithm {value!r} is not available yet (available: {', '.join(AVAILABLE_ALGORITHMS)})"
            )
        return value


KEY_NAME = "the name of the key that submitted the job; null when that key has none"


class JobPublic(BaseModel):
    id: str
    dataset: str
    key_name: str | None = Field(description=KEY_NAME)
    model: str
    algorithm: str
    status: JobStatus
    iteration: int = Field(description="iterations released so far")
    iterations: int
    batch_size: int
    sigma: float
    epsilon_target: float | None = Field(description="the epsilon asked for, if the job was given one")
    epsilon_job: float | None = Field(description="the whole job on its own; null when sigma = 0")
    epsilon_spent: float | None = Field(description="epsilon of the iterations charged so far")
    delta: float
    options: dict[str, int | float] = Field(description="whole-number options (topics, hidden) as integers")
    cancel_requested: bool
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    stored_bytes: int = Field(
        description="what the job's releases and posterior take (its estimate while queued or running), "
        "counted against its key's storage cap; 0 once deleted"
    )
    outputs_deleted_at: datetime | None = Field(
        description="when its releases and posterior were deleted (DELETE /v1/jobs/{id}/outputs)"
    )


LARGEST_EPSILON = (
    "the largest epsilon a job of this schedule (batch size, population, iterations) could still have: "
    "the job's own epsilon at the dataset's delta with the smallest noise multiplier whose cost, composed "
    "with what is spent and reserved now, stays within the cap (submit it as `epsilon`); null without a "
    "cap or when no such job fits"
)


class ResourceEstimate(BaseModel):
    """What a job is estimated to need (control.planning.resources); submission refuses one above the server's
    limits VIPS_MAX_JOB_MEMORY_MB, VIPS_MAX_RELEASE_MB and VIPS_MAX_JOB_STORED_MB."""

    memory_bytes: int = Field(description="peak memory of the worker running the job")
    release_bytes: int = Field(description="stored size of one release")
    stored_bytes: int = Field(description="stored size of all releases and the posterior")
    key_stored_bytes: int | None = Field(
        default=None,
        description="what the submitting key's jobs store now (queued and running ones at their estimates); "
        "with this job it must stay within key_max_stored_bytes (VIPS_MAX_KEY_STORED_MB)",
    )
    key_max_stored_bytes: int | None = Field(default=None, description="what one key's jobs may store")


class ScheduleChoice(BaseModel):
    """A job's schedule and where it came from (control.planning.schedules)."""

    iterations: int
    batch_size: int
    auto: list[str] = Field(
        description="the fields the server chose (iterations, batch_size, model options); empty: all given"
    )
    why: str = Field(description="the rule and the public facts it used, or 'given'")
    options: dict[str, int | float] = Field(
        default_factory=dict,
        description="the model options the server chose (stored with the job's options); the job's own win",
    )


class JobQuote(BaseModel):
    """A dry run: what the job would cost and what would remain; nothing is reserved."""

    dataset: str
    iterations: int
    batch_size: int
    schedule: ScheduleChoice | None = Field(default=None, description="how T and S were chosen")
    sigma: float
    delta: float
    epsilon_job: float | None = Field(
        description="the job on its own, by the budget's filter (what it is charged); null when sigma = 0"
    )
    epsilon_job_pld: float | None = Field(
        default=None,
        description="the job on its own by the tight `pld` accountant: valid for this job alone (its "
        "schedule is fixed at submission), not what the budget is charged, since later jobs may adapt to "
        "its output; null when sigma = 0",
    )
    epsilon_spent: MaybeInfinite = Field(description="the dataset's committed releases now" + NULL_UNBOUNDED)
    epsilon_reserved: MaybeInfinite = Field(
        description="committed releases plus open reservations now" + NULL_UNBOUNDED
    )
    epsilon_after: float | None = Field(
        description="reserved plus this job; null when it would be unbounded (sigma 0)"
    )
    epsilon_budget: float | None
    epsilon_remaining: float | None = Field(description="budget minus reserved now; null without a cap")
    admissible: bool
    largest_epsilon: float | None = Field(default=None, description=LARGEST_EPSILON)
    resources: ResourceEstimate | None = Field(default=None, description="the job's estimated resources")
    limit: Literal["dataset", "quota", "storage"] | None = Field(
        default=None,
        description="the limit that would refuse the job: `dataset` (its budget; checked first), `quota` "
        "(the submitting key's quota on the dataset) or `storage` (the key's stored outputs: resources); "
        "null when admissible. `admissible` takes all three into account, `largest_epsilon` the first two",
    )
    quota_epsilon: float | None = Field(
        default=None, description="the submitting key's quota on the dataset; null when it has none"
    )
    quota_epsilon_reserved: float | None = Field(
        default=None,
        description="the key's own charges and open reservations on the dataset composed at its delta "
        "(what the quota bounds); null without a quota",
    )
    quota_epsilon_after: float | None = Field(
        default=None, description="quota_epsilon_reserved with this job; null without a quota or unbounded"
    )
    quota_remaining: float | None = Field(
        default=None, description="quota minus quota_epsilon_reserved now; null without a quota"
    )
    note: str | None = Field(
        default=None,
        description="one line when the job would differ from what was asked (an epsilon no sigma at or "
        "above the floor reaches: sigma is at the floor and epsilon_job says what it costs); null otherwise",
    )


class BudgetRefusal(BaseModel):
    """409 body when the ledger cannot admit a job."""

    detail: str
    epsilon_spent_or_reserved: MaybeInfinite = Field(description="what the limit holds now" + NULL_UNBOUNDED)
    epsilon_requested_total: float | None
    epsilon_budget: float
    epsilon_remaining: float
    largest_epsilon: float | None = Field(
        default=None,
        description=LARGEST_EPSILON + "; within both the dataset's budget and the submitting key's quota",
    )
    limit: Literal["dataset", "quota"] = Field(
        default="dataset",
        description="which limit refused the job: `dataset` (the dataset's budget) or `quota` (the "
        "submitting key's quota on the dataset); the epsilon_* fields above are that limit's",
    )


class StorageRefusal(BaseModel):
    """409 body when the submitting key's stored outputs leave no room for the job (control.jobs.storage)."""

    detail: str
    limit: Literal["storage"] = "storage"
    key_stored_bytes: int = Field(description="what the key's jobs store now (queued and running: estimates)")
    key_max_stored_bytes: int = Field(description="what one key's jobs may store (VIPS_MAX_KEY_STORED_MB)")
    stored_bytes: int = Field(description="what this job would store (its estimate)")


class ReleasePublic(BaseModel):
    iteration: int
    statistics: dict[str, Any] = Field(description="the noisy released statistics, per block")
    noise_std: dict[str, Any]
    created_at: datetime


class Message(BaseModel):
    detail: str


# ---- keys ---------------------------------------------------------------------------------------------


class KeyCreate(_Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"role": "analyst", "dataset": "adult", "expires_in_days": 90, "name": "alice"},
                {"role": "custodian", "dataset": "adult"},
                {"role": "client", "all_datasets": True},
            ]
        },
    )

    role: Role
    dataset: str | None = Field(
        default=None,
        min_length=1,
        max_length=NAME_MAX_LENGTH,
        pattern=NAME_REGEX,
        description="scope: the one dataset this key sees (custodian, analyst and client keys); it need not "
        "exist yet",
    )
    all_datasets: bool = Field(
        default=False,
        description="analyst and client keys: see every dataset; they need this or a dataset",
    )
    expires_in_days: FiniteFloat | None = Field(
        default=None, gt=0, le=36_500, description="the key is refused (401) this many days from now"
    )
    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=KEY_NAME_MAX_LENGTH,
        description=f"a label of the key: 1-{KEY_NAME_MAX_LENGTH} printable characters without leading or "
        "trailing whitespace, not unique; public inside the deployment (shown with the key's jobs, in "
        "ledgers and on the dashboard)",
    )

    @field_validator("name")
    @classmethod
    def _printable_name(cls, value: str | None) -> str | None:
        if value is not None and (problem := key_name_problem(value)) is not None:
            raise ValueError(problem)
        return value


class KeyCreated(BaseModel):
    id: str
    name: str | None
    key: str = Field(description="shown once; only its sha256 is stored")
    role: Role
    dataset: str | None
    all_datasets: bool
    expires_at: datetime | None


class KeyPublic(BaseModel):
    """A key as admins see it: never its hash."""

    id: str
    name: str | None = Field(description="its label; null: none (keys made before names existed have none)")
    role: str
    dataset: str | None = Field(
        description="its scope; null: every dataset (analysts, clients) or the "
        "datasets a custodian key ingested"
    )
    all_datasets: bool
    created_at: datetime
    expires_at: datetime | None = Field(description="null: never expires")
    expired: bool
    revoked: bool


# ---- posteriors (docs/posterior-format.md) --------------------------------------------------------------


class PosteriorPrivacy(BaseModel):
    epsilon: float | None = Field(
        description="the job's epsilon on its own; null when it is infinite (sigma 0)"
    )
    epsilon_is_infinite: bool
    delta: float
    sigma: float = Field(description="the noise multiplier of every release")
    iterations: int
    batch_size: int
    population: int
    sampling: str = Field(description="how each minibatch was drawn: without_replacement")
    neighbouring: str = Field(description="the neighbouring relation of the guarantee: replace_one")
    accountant: str


class _Posterior(BaseModel):
    """What every posterior document carries; each family adds what prediction needs."""

    model_config = ConfigDict(extra="allow")

    format_version: int
    algorithm: Algorithm
    dataset: str
    job_id: str
    privacy: PosteriorPrivacy
    natural_parameters: dict[str, Any] = Field(description="the approximate posterior's natural parameters")
    sufficient_statistics: dict[str, Any] = Field(description="the last released (noised) statistics")
    variational_parameters: dict[str, Any]


class BlrPosterior(_Posterior):
    """Bayesian logistic regression: q(w) = N(mean, covariance) over the feature columns."""

    model: Literal["blr"]
    mean: list[float]
    covariance: list[list[float]]
    columns: list[str] | None = Field(
        default=None, description="the feature columns' names, in mean's order (absent in older documents)"
    )
    label: str | None = Field(default=None, description="the label column's name (absent in older documents)")


class LinregPosterior(_Posterior):
    """Bayesian linear regression: q(w) = N(mean, covariance); the noise variance of y given x."""

    model: Literal["linreg"]
    mean: list[float]
    covariance: list[list[float]]
    noise_variance: float
    noise_precision: dict[str, float] | None = Field(default=None, description="Gamma shape and rate (VIPS)")
    columns: list[str] | None = Field(
        default=None, description="the feature columns' names, in mean's order (absent in older documents)"
    )
    label: str | None = Field(default=None, description="the target column's name (not in older documents)")


class LdaTopic(BaseModel):
    word_ids: list[int] = Field(description="the topic's 20 most probable word ids, most probable first")
    probabilities: list[float] = Field(description="E[beta_kw] of those words")


class LdaPosterior(_Posterior):
    """Latent Dirichlet allocation: q(beta_k) = Dirichlet(lambda_k) per topic, over the vocabulary."""

    model: Literal["lda"]
    lambda_: list[list[float]] = Field(alias="lambda", description="K x V Dirichlet parameters")
    topics: list[LdaTopic]
    vocabulary: list[str] | None = Field(default=None, description="word v of lambda's column v")
    word_prior: str | None = Field(
        default=None, description="the public word frequencies the unigram fallback shrank towards"
    )
    private_unigram: list[float] | None = Field(
        default=None,
        description="the unigram fallback's private word frequencies (V, summing to 1), when it was used",
    )


class SbnPosterior(_Posterior):
    """Sigmoid belief network: posterior means of the weights W (J visible x K hidden) and biases."""

    model: Literal["sbn"]
    W: list[list[float]]
    b: list[float] = Field(description="hidden biases (K)")
    c: list[float] = Field(description="visible biases (J)")
    columns: list[str] | None = Field(default=None, description="the visible columns' names")


Posterior = Annotated[
    BlrPosterior | LinregPosterior | LdaPosterior | SbnPosterior, Field(discriminator="model")
]
