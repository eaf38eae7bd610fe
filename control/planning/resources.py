"""What a job will cost the worker and the control database, estimated before admission (issue 21).

From the dataset's public shape (kind, rows N, dimension d / vocabulary V / pixels J, as the `datasets`
row holds them) and the spec (batch size S, iterations T, model options), each model's function below
counts three numbers of float64 values, read off the model's code (vips.models.*) and its wall query
(privacy_wall.queries.*):

- working: the numpy arrays alive at the job's busiest moment (E-step, M-step, noise, post-processing);
- release: the values of one stored release (the post-processed statistics the gate returns);
- posterior: the values of the posterior document stored at the end.

The estimates (`estimate`) are then
  memory_bytes  = WORKER_BASE_BYTES + 8 working + max(RELEASE_SERIALISED_BYTES release,
                                                      POSTERIOR_SERIALISED_BYTES posterior)
  release_bytes = 8 release + RELEASE_OVERHEAD_BYTES
  stored_bytes  = T release_bytes + POSTERIOR_BYTES_PER_VALUE posterior
A release is stored as .npz (control.store.release_arrays: 8 bytes per float64, deflated only where that
shrinks it, plus headers); the posterior document is JSON (docs/posterior-format.md). The serialisation
terms count what storing a document costs on top of its arrays. tests/test_resources.py checks the
estimates against peaks measured with tracemalloc.
"""

from __future__ import annotations

from dataclasses import dataclass

from control.errors import Loc
from control.jobs.storage import human_bytes
from control.planning.options import LDA_DEFAULTS, SBN_DEFAULTS

#: A stored release: 8 bytes per float64 (.npz, deflated only where a sample shrinks to 3/4:
#: control.store.release_arrays), plus 216 bytes per block (its .npy header and zip entries; up to 7 blocks)
#: and the zip's 22-byte end record.
RELEASE_BYTES_PER_VALUE = 8
RELEASE_OVERHEAD_BYTES = 7 * 216 + 22
#: Storing a release: the .npz in its growing buffer, its final copy and the database driver's copy.
RELEASE_SERIALISED_BYTES = 4 * RELEASE_BYTES_PER_VALUE
#: Bytes one float64 of the posterior's JSON takes (repr of up to 17 significant digits, sign, exponent,
#: ", ").
POSTERIOR_BYTES_PER_VALUE = 24
#: A float in a list from ndarray.tolist(): a 24-byte float object and an 8-byte list slot.
PYTHON_FLOAT_BYTES = 32
#: Storing the posterior: its Python lists, its JSON text and the database driver's copy of the text.
POSTERIOR_SERIALISED_BYTES = PYTHON_FLOAT_BYTES + 2 * POSTERIOR_BYTES_PER_VALUE
#: A worker process before any job: the interpreter, numpy, scipy, SQLAlchemy and Celery.
WORKER_BASE_BYTES = 256 << 20
FLOAT_BYTES = 8

#: Mirrors of the wall's and the models' constants (service must not import them; tests check they agree).
SBN_CHUNK_ROWS = 1024  # privacy_wall.queries.sbn.CHUNK_ROWS
LDA_RESAMPLE_CHUNK = 1024  # privacy_wall.queries.lda.RESAMPLE_CHUNK
LDA_CHUNK_ELEMENTS = 2**19  # privacy_wall.queries.lda.CHUNK_ELEMENTS
SBN_DEFAULT_FREQUENCY_COPIES = 4  # privacy_wall.queries.sbn.DEFAULT_FREQUENCY_COPIES
DPVI_DEFAULT_DRAWS = 1


@dataclass(frozen=True)
class Footprint:
    """Float64 counts of one job (module docstring) and what drives them, for the refusal's message."""

    working: int
    release: int
    posterior: int
    driver: Loc  # the spec field that makes the arrays large
    why: str  # the shape in words, e.g. "hidden 500 x 256 pixels"


@dataclass(frozen=True)
class Resources:
    memory_bytes: int
    release_bytes: int
    stored_bytes: int
    driver: Loc
    why: str


#: privacy_wall.queries.base.CHUNK_ELEMENTS and MIN_CHUNK_ROWS: the per-record queries (BLR, linear
#: regression, DPVI, DP-SEP) compute on chunks of rows, so their temporaries are C x d, not S x d.
QUERY_CHUNK_ELEMENTS = 1 << 18
QUERY_MIN_CHUNK_ROWS = 256


def chunk_rows(d: int, s: int) -> int:
    """C: the rows of one chunk of a per-record query's batch (privacy_wall.queries.base.chunked_sums)."""
    return min(s, max(QUERY_MIN_CHUNK_ROWS, QUERY_CHUNK_ELEMENTS // max(1, d)))


def blr_footprint(d: int, s: int) -> Footprint:
    """VIPS-BLR (chunks of C rows): the batch (S d) and, per chunk, x E[ww^T] and x * xi (2 C d); the
    d x d blocks of the E-step, the PSD projection of s2 and the Gaussian state (10 d^2). Release s1 (d)
    + s2 mirrored (d^2). Posterior: five d x d matrices and six d-vectors (5 d^2 + 6 d)."""
    working = s * d + 2 * chunk_rows(d, s) * d + 10 * d * d
    return Footprint(working, d + d * d, 5 * d * d + 6 * d, ("batch_size",), f"{d} features")


def linreg_footprint(d: int, s: int) -> Footprint:
    """Bayesian linear regression (chunks of C rows): the batch (S d) and its labels (S); per chunk, its
    finite-masked copy and the clipped copy (2 C d), the labels' masked and clipped copies, the row norms
    and clip factors (7 C); the (d + 1)^2 joint moment, its
    PSD projection and the state (10 (d + 1)^2). Release xx (d^2) + yx (d) + yy (1). Posterior: Lambda
    twice, the statistics' xx and the covariance (4 d^2), eta, yx and the mean twice (4 d), 8 scalars."""
    return Footprint(
        s * d + s + 2 * chunk_rows(d, s) * d + 7 * chunk_rows(d, s) + 10 * (d + 1) ** 2,
        d * d + d + 1,
        4 * d * d + 4 * d + 8,
        ("batch_size",),
        f"{d} features",
    )


def dpvi_footprint(d: int, s: int, draws: int) -> Footprint:
    """DPVI-BLR (D draws, chunks of C rows): the batch (S d) and its labels (S); per chunk, at clip_rows'
    norm, the C x 2d per-example gradients, their finite copy, that copy divided by each row's peak and
    its squares inside np.linalg.norm (8 C d; the halves and their concatenation before it peak at
    4 C d); the C x D logits, their NaN-free copy and the residuals (3 C D); the per-row peaks, scales,
    norms and factors (5 C); the posterior's
    d x d diagonals and second moment (4 d^2). Release the 2 d gradient. Posterior: the diagonal precision
    and covariance and -E[w w^T] / 2 (3 d^2), the gradient (2 d) and five d-vectors (7 d)."""
    return Footprint(
        s * d + s + chunk_rows(d, s) * (8 * d + 3 * draws + 5) + 4 * d * d,
        2 * d,
        3 * d * d + 7 * d,
        ("batch_size",),
        f"{d} features",
    )


#: privacy_wall.queries.dpsep.QUADRATURE_NODES (the logistic sites' Gauss-Hermite nodes).
DPSEP_QUADRATURE_NODES = 64


def dpsep_footprint(d: int, s: int, logistic: bool) -> Footprint:
    """DP-SEP (chunks of C rows): the batch (S d) and its labels (S); per chunk, its finite-masked copy and
    x Sigma (or x beta) (2 C d); for the logistic likelihood, the quadrature's C x K arrays (K = 64 nodes:
    the nodes a, log-weights, weights, sigmoids and the products of g, h and the curvature, 7 C K); the
    labels' copies, cavity marginals, site parameters, norms and clip_sites' temporaries (23 C); the
    site precision, its mirror and PSD projection and the Gaussian states (12 d^2). Release eta (d) +
    precision (d^2); for linear regression's Normal-Gamma sites the chunk's bounded copies of x, z = (x, y),
    z^2 and the scaled z (5 C d in place of 2 C d) and a release of at most (d + 1)^2. Posterior:
    6 d^2 + 6 d."""
    c = chunk_rows(d, s)
    copies = 2 if logistic else 5
    quadrature = 7 * c * DPSEP_QUADRATURE_NODES if logistic else 0
    return Footprint(
        s * d + s + copies * c * d + quadrature + 23 * c + 12 * d * d,
        d + d * d if logistic else (d + 1) ** 2,
        6 * d * d + 6 * d,
        ("batch_size",),
        f"{d} features",
    )


def lda_footprint(v: int, s: int, topics: int, doc_length: int, unigram: bool = False) -> Footprint:
    """LDA (K topics, V words, N_w tokens per document): the K x V arrays, i.e. lambda, the last release,
    E[log beta], the query's table and totals, means, noise, noised and clipped copies (9 K V); the
    resampling's S x N_w uniforms plus 4 arrays of min(S, 1024) x N_w per chunk of documents; the
    resampled counts (2 S min(V, N_w)); and the E-step's padded chunks (4 x 2^19). Release s (K V), with
    the unigram fallback also u (V). Posterior: E[log beta], the statistics and lambda twice (4 K V) plus
    K x 10 top words."""
    tokens = doc_length if doc_length > 0 else v
    resample = s * doc_length + 4 * min(s, LDA_RESAMPLE_CHUNK) * doc_length
    kv = topics * v
    working = 9 * kv + resample + 2 * s * min(v, tokens) + 4 * LDA_CHUNK_ELEMENTS
    driver: Loc = ("options", "doc_length") if resample > 9 * kv else ("options", "topics")
    why = f"{topics} topics x {v} words, {s} documents x doc_length {doc_length}"
    release = kv + (v if unigram else 0)
    return Footprint(working, release, 4 * kv + 10 * topics, driver, why)


def sbn_footprint(j: int, s: int, hidden: int, frequency_copies: int = 1) -> Footprint:
    """SBN (J pixels, K hidden units; Q = (K + 1)^2, P = K (K + 1) / 2, chunks of C = min(S, 1024) rows):
    the J Q blocks, i.e. precision, covariance and running data precision of the state, E[w w^T], its
    symmetrised copy, the M-step's new average, its shrinkage target and residual, and the PSD projection
    (9 J Q); the packed J P arrays of the E-step and the gate (sums per chunk,
    means, noise: (3 + ceil(S / C)) J P); the last release's and the E-step's J K^2 (2 J K^2); per chunk
    C (2 K^2 + 2 P); the batch (3 S J). Release s1 (K), s3 (J, frequency_copies times), s4 (J), s5, s6
    (J K), s7 mirrored (J K^2). Posterior: three J Q matrices, four J (K + 1) blocks, the statistics, and
    vectors (6 K + 2 J)."""
    k = hidden
    q, p = (k + 1) ** 2, k * (k + 1) // 2
    chunk = min(s, SBN_CHUNK_ROWS)
    chunks = -(-s // SBN_CHUNK_ROWS)
    release = k + (1 + frequency_copies) * j + 2 * j * k + j * k * k
    working = 9 * j * q + (3 + chunks) * j * p + 2 * j * k * k + chunk * (2 * k * k + 2 * p) + 3 * s * j
    posterior = 3 * j * q + 4 * j * (k + 1) + release + 6 * k + 2 * j
    return Footprint(working, release, posterior, ("options", "hidden"), f"hidden {k} x {j} pixels")


def footprint(
    model: str, algorithm: str, options: dict[str, float], dimension: int, batch_size: int
) -> Footprint:
    """The footprint of a checked spec (model, algorithm and options already valid)."""
    d, s = int(dimension), int(batch_size)
    if algorithm == "dpvi":
        return dpvi_footprint(d, s, int(options.get("draws", DPVI_DEFAULT_DRAWS)))
    if algorithm == "dpsep":
        return dpsep_footprint(d, s, logistic=model == "blr")
    if model == "linreg":
        return linreg_footprint(d, s)
    if model == "lda":
        topics = int(options.get("topics", LDA_DEFAULTS["topics"]))
        doc_length = int(options.get("doc_length", LDA_DEFAULTS["doc_length"]))
        return lda_footprint(d, s, topics, doc_length, unigram=options.get("unigram_share", 0.0) > 0)
    if model == "sbn":
        copies = int(options.get("frequency_copies", SBN_DEFAULT_FREQUENCY_COPIES))
        return sbn_footprint(d, s, int(options.get("hidden", SBN_DEFAULTS["hidden"])), copies)
    return blr_footprint(d, s)


def estimate(
    model: str, algorithm: str, options: dict[str, float], dimension: int, batch_size: int, iterations: int
) -> Resources:
    """memory, release and stored bytes of a job (module docstring)."""
    f = footprint(model, algorithm, options, dimension, batch_size)
    serialised = max(RELEASE_SERIALISED_BYTES * f.release, POSTERIOR_SERIALISED_BYTES * f.posterior)
    release = RELEASE_BYTES_PER_VALUE * f.release + RELEASE_OVERHEAD_BYTES
    return Resources(
        memory_bytes=WORKER_BASE_BYTES + FLOAT_BYTES * f.working + serialised,
        release_bytes=release,
        stored_bytes=iterations * release + POSTERIOR_BYTES_PER_VALUE * f.posterior,
        driver=f.driver,
        why=f.why,
    )


def resource_errors(
    resources: Resources,
    iterations: int,
    *,
    max_memory_mb: float,
    max_release_mb: float,
    max_stored_mb: float,
) -> list[tuple[Loc, str]]:
    """The limits `resources` exceeds, as SpecError entries naming the estimate and the limit."""
    mb = 1 << 20
    errors: list[tuple[Loc, str]] = []
    if resources.memory_bytes > max_memory_mb * mb:
        errors.append(
            (
                resources.driver,
                f"this job needs about {human_bytes(resources.memory_bytes)} of worker memory "
                f"({resources.why}); the server allows {human_bytes(max_memory_mb * mb)} "
                "(VIPS_MAX_JOB_MEMORY_MB)",
            )
        )
    if resources.release_bytes > max_release_mb * mb:
        errors.append(
            (
                resources.driver,
                f"each release of this job would store about {human_bytes(resources.release_bytes)} "
                f"({resources.why}); the server allows {human_bytes(max_release_mb * mb)} "
                "(VIPS_MAX_RELEASE_MB)",
            )
        )
    if resources.stored_bytes > max_stored_mb * mb:
        errors.append(
            (
                ("iterations",),
                f"this job would store about {human_bytes(resources.stored_bytes)} ({iterations} releases "
                f"of {human_bytes(resources.release_bytes)} and its posterior); the server allows "
                f"{human_bytes(max_stored_mb * mb)} (VIPS_MAX_JOB_STORED_MB)",
            )
        )
    return errors
