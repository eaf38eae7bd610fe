"""DP-SEP's moment matching behind the wall (Vinaroz and Park, TMLR 2022, Alg. 3), for Bayesian logistic
regression and for linear regression (with a known noise variance, or Normal-Gamma with it unknown).

SEP keeps one Gaussian site factor f(w), with natural parameters theta_f = (eta_f, Lambda_f)
(precision-times-mean, precision), replicated N times: q(w) = p0(w) f(w)^N. Given the public cavity
q_-1 = q / f = p0 f^(N - 1) = N(mu_c, Sigma_c) (vips.models.blr.dpsep computes it from released values), for
each record n of the minibatch (Alg. 3 steps 4-7, vectorised over the batch):

  tilted        p~_n(w) propto q_-1(w) p(y_n | w^T x_n)
  moment match  f_n = proj[p~_n] / q_-1
  clip          theta_fn scaled to ||theta_fn||_2 <= C

The likelihood depends on w only through a = x_n^T w, so the tilted distribution differs from the cavity
only along x_n and the site is rank one: eta_fn = alpha_n x_n, Lambda_fn = beta_n x_n x_n^T, where
(alpha_n, beta_n) are the natural parameters of the 1-D site along a. With the cavity marginal of a,
N(m_n, v_n), m_n = x_n^T mu_c, v_n = x_n^T Sigma_c x_n, and g, h the first two derivatives of
log Z(m) = log E_{N(a; m, v)}[p(y | a)] at m = m_n:

  beta = -h / (1 + v h),      alpha = g (1 + v beta) + m beta

(equivalent to beta = 1/v_tilted - 1/v, alpha = m_tilted / v_tilted - m / v, without dividing by v).

- Logistic, p(y | a) = sigmoid(s a), s = 2y - 1: g and h are tilted expectations of the derivatives of
  log sigmoid(s a), g = E~[s sigmoid(-s a)], h = Var~[s sigmoid(-s a)] - E~[sigmoid(a) sigmoid(-a)],
  computed by Gauss-Hermite quadrature along x_n with QUADRATURE_NODES nodes (a fixed count) in log space
  (no underflow for confidently misclassified records). The likelihood is log-concave with curvature
  <= 1/4, so 0 <= beta <= 1/4 exactly (Cramer-Rao for the tilted density); beta is clamped to [0, 1/4]
  to remove quadrature error. Hence ||Lambda_fn||_F = beta ||x||^2 <= 1/4.
- Gaussian, p(y | a) = N(y; a, 1/tau) with known tau (`noise_precision`): moment matching is exact and the
  site is the likelihood itself, alpha = tau y, beta = tau, whatever the cavity (the cavity parameters are
  validated but not used).

Clipping (the paper's steps 7 and Prop. 1: one bound C on the norm of the site's natural parameters
theta_fn): the L2 norm of the concatenation (eta_fn, Lambda_fn) with the matrix in Frobenius norm,
||theta_fn||^2 = alpha^2 ||x||^2 + beta^2 ||x||^4, is scaled down to <= C. The released vector is
(eta_fn, packed upper triangle of Lambda_fn), whose norm is at most ||theta_fn|| (the packed triangle
counts each off-diagonal entry once), so each record's released contribution has norm <= C.

Centred release (DpSepLogisticQuery(centred=True), vips.models.blr.dpsep's noise_aware mode; issue 51). The
site's eta part is released relative to the cavity's mean: per record the pair

  (kappa (alpha_n - beta_n m_n) x_n,  beta_n x_n x_n^T),   alpha_n - beta_n m_n = g_n (1 + v_n beta_n),

with kappa = GRADIENT_SCALE, clipped jointly to C as above. g_n (1 + v_n beta_n) is the site's gradient
at the cavity mean, eta_fn - Lambda_fn mu_c = (alpha_n - beta_n m_n) x_n (as m_n = x_n^T mu_c), so the
paper's (eta_fn, Lambda_fn) is a public affine image of it before the clip; only which records the clip
scales, and by how much, differs (one factor per record either way). In the paper's coordinates the noise on
the precision enters q's mean multiplied by the weights (Lambda_f's noise times mu), which is what left its
intervals covering 0.2-0.6; centred, it is multiplied by the step from mu_c. kappa = 1/2 splits the noise
between the two parts as VIPS-BLR's release (g / 2 beside H) does. Privacy: the same argument as below,
word for word, since it never uses what the clipped vector holds: every record's released contribution has
norm <= C after the clip, so replacing one record moves the block's sum by at most 2 C.

Normal-Gamma sites (DpSepNormalGammaQuery, vips.models.linreg.dpsep's noise-aware linear regression; issue
51).
With the noise precision tau unknown, a record's likelihood tau^(1/2) exp(-tau (y - w^T x)^2 / 2) is an
exponential family in (w, tau) with statistics (y x, x x^T, y^2, 1): the Normal-Gamma prior is conjugate, so
moment matching is exact and the site is the likelihood itself, whatever the cavity (no public parameters).
The record is first clipped to the ingestion bounds (||x|| <= 1, |y| <= 1, as privacy_wall.queries.linreg);
its released vector is v_n = P(z z^T), the packed upper triangle of the (d + 1) x (d + 1) PSD matrix of
z = (x, y), which holds x x^T's triangle, y x and y^2 (the count 1 is public and not released: the public
half counts N records), scaled to ||v_n|| <= C. Sensitivity sqrt(2) C / S, not 2 C / S, although y x is
signed: for PSD A, A' the packed triangles satisfy <P(A), P(A')> = (tr(A A') + sum_i A_ii A'_ii) / 2 >= 0,
so ||v - v'||^2 <= ||v||^2 + ||v'||^2 <= 2 C^2 (the Block rule for PSD contributions, scaled by the clip
factors >= 0), reached by orthogonal z, z' of norm >= C. ||P(z z^T)||^2 = (||z||^4 + sum_i z_i^4) / 2 <= 3
within the bounds, so a clip C >= sqrt(3) clips nothing; a smaller one tempers the likelihood of the
records of large norm by their clip factor while the public half counts them whole. Postprocessing: the
released mean, a noised mean of PSD matrices, is mirrored and projected to the PSD cone, and split into
"xx", "yx" and "yy", as privacy_wall.queries.linreg's is.

Released block (one, general sign since eta_fn is signed): "site" = (1/S) sum_n clip(theta_fn), per-record
bound C, replace-one sensitivity Delta = 2 C / S. Post-processing (data-independent): split it into
"precision_times_mean" (d,) and "precision" (d x d, mirrored and projected to PSD, so that q's precision
p0 + N Lambda_f stays >= the prior's after the public damped update).

Privacy of the released quantity versus the paper's damped update. The public half updates the shared
site by theta_f <- (1 - gamma) theta_f + gamma r, where r is the release (vips.models.blr.dpsep). The paper
instead noises the damped update itself, one datapoint at a time:
  theta_new = (1 - gamma_p / N) theta_f + (gamma_p / N) clip(theta_fn) + n,
  n ~ N(0, sigma^2 Delta_new^2 I),  Delta_new = 2 gamma_p C / N                       (Alg. 3, Prop. 1).
Claim: for every S, the damped release with gamma = gamma_p S / N (S sites, each with the paper's weight
gamma_p / N) has exactly the distribution of the paper's noised update, and the two are the same mechanism.
Proof: theta_f is public (a function of earlier releases only), and r = (1/S) sum_n clip(theta_fn) + z with
z ~ N(0, sigma^2 (2 C / S)^2 I) (B = 1 block). Then
  (1 - gamma) theta_f + gamma r = (1 - gamma_p S / N) theta_f + (gamma_p / N) sum_n clip(theta_fn) + gamma z,
  gamma z ~ N(0, sigma^2 (2 gamma_p C / N)^2 I),
i.e. the paper's update (at S = 1, term for term) with the paper's noise std sigma Delta_new. The map
r -> (1 - gamma) theta_f + gamma r is affine, fixed before the release, and invertible for gamma > 0, so
for neighbouring D, D' and every order alpha the Renyi divergence between the damped outputs equals the one
between the releases (post-processing gives <= both ways). Both are the Gaussian mechanism with noise
multiplier sigma (noise std / sensitivity: sigma 2 C / S over 2 C / S, or sigma Delta_new over Delta_new)
on S records drawn uniformly without replacement from N (docs/design.md section 2), so the gate's charge of
one subsampled Gaussian event per iteration is exactly the paper's privacy loss, never less. It is not looser
anywhere and it is tighter than two common misreadings: clipping eta_fn and Lambda_fn to C separately
would need sqrt(2) more noise for the same multiplier (here one joint clip, as in Prop. 1, where
||theta_fn||_2 is the norm of the whole natural-parameter vector), and counting the two natural parameters
as two releases on the same minibatch would undercount under amplification (docs/design.md section 2). Damping
is pure post-processing here, so a schedule gamma_t changes nothing in the analysis; the paper's step 12 (clip
theta_f to C) and step 10 (PSD projection) are post-processing too and run outside the wall.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.polynomial.hermite_e import hermegauss
from scipy.special import expit

from privacy_wall.data.store import Batch
from privacy_wall.noise.mechanisms import clip_factors, project_psd, symmetric_from_upper, upper_triangle
from privacy_wall.queries.base import Array, Block, chunked_sums
from privacy_wall.queries.linreg import bounded_records, split_joint

BLOCK = "site"
PARAMS = ("cavity_mean", "cavity_covariance")

#: Gauss-Hermite nodes of the logistic tilted moments. With 64 nodes g and h agree with adaptive quadrature
#: to < 1e-8 for cavity variances v <= 3 along x (the prior N(0, I) gives v = ||x||^2 <= 1, and v shrinks
#: as data arrive), ~2e-5 at v = 10 and ~3e-3 at v = 30 (tests/privacy_wall/queries/test_dpsep.py checks
#: v <= 3).
QUADRATURE_NODES = 64

#: kappa: the centred release's scale of the gradient part (module docstring, "Centred release"); the
#: public half divides it out.
GRADIENT_SCALE = 0.5

#: The curvature bound of -log sigmoid: the logistic site precision along x lies in [0, 1/4].
LOGISTIC_SITE_PRECISION_BOUND = 0.25

#: Cavity marginals are clamped to |m| <= MAX_ACTIVATION and 0 <= v <= MAX_VARIANCE before moment matching,
#: so that extreme (finite) public parameters cannot produce inf - inf; real posteriors are far inside.
MAX_ACTIVATION = 1e8
MAX_VARIANCE = 1e8

#: The largest norm of a Normal-Gamma site within the ingestion bounds: a clip this large clips nothing.
NORMAL_GAMMA_SITE_BOUND = math.sqrt(3.0)

_NODES, _WEIGHTS = hermegauss(QUADRATURE_NODES)
_LOG_WEIGHTS = np.log(_WEIGHTS / math.sqrt(2.0 * math.pi))  # probabilists' weights sum to sqrt(2 pi)


def cavity_marginals(x: Array, mean: Array, covariance: Array) -> tuple[Array, Array]:
    """m_n = x_n^T mu_c and v_n = x_n^T Sigma_c x_n, clamped to the ranges above (NaN -> 0)."""
    m = np.nan_to_num(x @ mean, nan=0.0, posinf=MAX_ACTIVATION, neginf=-MAX_ACTIVATION)
    v = np.nan_to_num(np.einsum("ij,ij->i", x @ covariance, x), nan=0.0, posinf=MAX_VARIANCE, neginf=0.0)
    return np.clip(m, -MAX_ACTIVATION, MAX_ACTIVATION), np.clip(v, 0.0, MAX_VARIANCE)


def logistic_log_partition_derivatives(labels: Array, m: Array, v: Array) -> tuple[Array, Array]:
    """g = d/dm log Z and h = d^2/dm^2 log Z for Z(m, v) = E_{N(a; m, v)}[sigmoid(s a)], s = 2y - 1.

    Gauss-Hermite in log space: a_k = m + sqrt(v) t_k, tilted weights W_k propto w_k sigmoid(s a_k);
    g = sum_k W_k s sigmoid(-s a_k),
    h = sum_k W_k sigmoid(-s a_k)^2 - g^2 - sum_k W_k sigmoid(a_k) sigmoid(-a_k).
    """
    s = np.where(labels > 0.5, 1.0, -1.0)[:, None]
    a = m[:, None] + np.sqrt(v)[:, None] * _NODES[None, :]  # (S, K)
    log_tilted = _LOG_WEIGHTS[None, :] - np.logaddexp(0.0, -s * a)  # log w_k + log sigmoid(s a_k)
    log_tilted -= log_tilted.max(axis=1, keepdims=True)
    weights = np.exp(log_tilted)
    weights /= weights.sum(axis=1, keepdims=True)
    wrong = expit(-s * a)  # sigmoid(-s a): (d/da) log sigmoid(s a) = s sigmoid(-s a)
    g = s[:, 0] * np.sum(weights * wrong, axis=1)
    second = np.sum(weights * wrong * wrong, axis=1)
    curvature = np.sum(weights * wrong * (1.0 - wrong), axis=1)  # -(d^2/da^2) log sigmoid(s a)
    h = second - g * g - curvature
    return g, h


def logistic_centred_sites(labels: Array, m: Array, v: Array) -> tuple[Array, Array]:
    """(alpha - beta m, beta) = (g (1 + v beta), beta): the 1-D site along x centred at the cavity mean."""
    g, h = logistic_log_partition_derivatives(labels, m, v)
    denominator = 1.0 + v * h  # = v_tilted / v > 0 in exact arithmetic
    beta = np.where(
        denominator > 0, -h / np.where(denominator > 0, denominator, 1.0), LOGISTIC_SITE_PRECISION_BOUND
    )
    beta = np.clip(beta, 0.0, LOGISTIC_SITE_PRECISION_BOUND)
    return g * (1.0 + v * beta), beta


def logistic_sites(labels: Array, m: Array, v: Array) -> tuple[Array, Array]:
    """1-D site natural parameters (alpha, beta) along x of the logistic likelihood (module docstring)."""
    gradient, beta = logistic_centred_sites(labels, m, v)
    return gradient + m * beta, beta


def clip_sites(alpha: Array, beta: Array, sq_norms: Array, bound: float) -> tuple[Array, Array]:
    """Scale each record's (alpha x, beta x x^T) to ||(eta, Lambda)||_2 <= bound (Frobenius for Lambda).

    Non-finite sites (impossible for finite inputs within the clamps above) become 0.
    """
    finite = np.isfinite(alpha) & np.isfinite(beta) & np.isfinite(sq_norms)
    alpha = np.where(finite, alpha, 0.0)
    beta = np.where(finite, beta, 0.0)
    sq_norms = np.where(finite, sq_norms, 0.0)
    # Norm computed as |.| times a unit-scale root so that large finite values do not overflow.
    peak = np.maximum(np.abs(alpha) * np.sqrt(sq_norms), np.abs(beta) * sq_norms)
    safe_peak = np.where(peak > 0, peak, 1.0)
    norms = safe_peak * np.sqrt(
        (alpha * np.sqrt(sq_norms) / safe_peak) ** 2 + (beta * sq_norms / safe_peak) ** 2
    )
    factors = clip_factors(np.where(peak > 0, norms, 0.0), bound)
    return alpha * factors, beta * factors


def checked_clip(clip: float) -> float:
    """A site clip C, refused unless a finite number > 0 (a bool is not a number here)."""
    if isinstance(clip, bool) or not isinstance(clip, int | float) or not (0 < clip < math.inf):
        raise ValueError("clip must be a finite number > 0")
    return float(clip)


class DpSepQuery:
    """Shared machinery of the DP-SEP queries: one block of clipped site natural parameters."""

    name = "dpsep"

    def __init__(self, clip: float) -> None:
        self.clip = checked_clip(clip)

    def sites(self, labels: Array, m: Array, v: Array) -> tuple[Array, Array]:
        """1-D site natural parameters (alpha_n, beta_n) along x_n given the cavity marginals of x_n^T w."""
        raise NotImplementedError

    def blocks(self, dimension: int) -> tuple[Block, ...]:
        return (Block(BLOCK, self.clip),)

    def validate_params(self, params: dict[str, Array], dimension: int) -> None:
        if set(params) != set(PARAMS):
            raise ValueError(
                f"{self.name} takes exactly the public parameters cavity_mean and cavity_covariance"
            )
        shapes = {"cavity_mean": (dimension,), "cavity_covariance": (dimension, dimension)}
        for key, shape in shapes.items():
            value = np.asarray(params[key])
            real = np.issubdtype(value.dtype, np.floating) or np.issubdtype(value.dtype, np.integer)
            if value.shape != shape or not real or not np.isfinite(value).all():
                raise ValueError(f"{key} must be a finite real array of shape {shape}")

    def clipped_sums(
        self, batch: Batch, params: dict[str, Array], rng: np.random.Generator
    ) -> dict[str, Array]:
        """Per-record clipped contributions summed chunk by chunk (base.chunked_sums)."""
        return chunked_sums(batch, lambda rows: self._chunk_sums(rows, params))

    def _chunk_sums(self, batch: Batch, params: dict[str, Array]) -> dict[str, Array]:
        x, y = batch.features, batch.labels
        if y is None:
            raise ValueError(f"{self.name} needs labelled rows")
        mean = np.asarray(params["cavity_mean"], dtype=np.float64)
        covariance = np.asarray(params["cavity_covariance"], dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
            finite = np.isfinite(x).all(axis=1) & np.isfinite(y)
            x = np.where(finite[:, None], x, 0.0)
            y = np.where(finite, y, 0.0)
            m, v = cavity_marginals(x, mean, covariance)
            alpha, beta = self.sites(y, m, v)
            sq_norms = np.einsum("ij,ij->i", x, x)
            alpha, beta = clip_sites(alpha, beta, sq_norms, self.clip)
            eta = x.T @ alpha
            precision = (x * beta[:, None]).T @ x
        return {BLOCK: np.concatenate([eta, upper_triangle(precision)])}

    def postprocess(self, noised_means: dict[str, Array], dimension: int) -> dict[str, Array]:
        """Split the site into eta (d,) and the precision (mirrored, projected to PSD)."""
        site = noised_means[BLOCK]
        precision = project_psd(symmetric_from_upper(site[dimension:], dimension))
        return {"precision_times_mean": site[:dimension].copy(), "precision": precision}


class DpSepLogisticQuery(DpSepQuery):
    """DP-SEP moment matching for Bayesian logistic regression (labels in {0, 1}); centred: the site's eta
    part released as its gradient at the cavity mean, scaled by GRADIENT_SCALE (module docstring)."""

    name = "dpsep-blr"

    def __init__(self, clip: float, centred: bool = False) -> None:
        super().__init__(clip)
        self.centred = bool(centred)

    def sites(self, labels: Array, m: Array, v: Array) -> tuple[Array, Array]:
        if self.centred:
            gradient, beta = logistic_centred_sites(labels, m, v)
            return GRADIENT_SCALE * gradient, beta
        return logistic_sites(labels, m, v)

    def postprocess(self, noised_means: dict[str, Array], dimension: int) -> dict[str, Array]:
        """As DpSepQuery's; centred, the first part is the gradient, kappa divided out ("gradient")."""
        statistics = super().postprocess(noised_means, dimension)
        if self.centred:
            statistics = {
                "gradient": statistics.pop("precision_times_mean") / GRADIENT_SCALE,
                "precision": statistics["precision"],
            }
        return statistics


class DpSepLinearQuery(DpSepQuery):
    """DP-SEP for linear regression with known noise precision tau: exact sites (tau y x, tau x x^T)."""

    name = "dpsep-linreg"

    def __init__(self, clip: float, noise_precision: float) -> None:
        super().__init__(clip)
        if not (0 < noise_precision < math.inf):
            raise ValueError("noise_precision must be a finite number > 0")
        self.noise_precision = float(noise_precision)

    def sites(self, labels: Array, m: Array, v: Array) -> tuple[Array, Array]:
        tau = self.noise_precision
        return tau * labels, np.full(labels.shape, tau)


class DpSepNormalGammaQuery:
    """DP-SEP for Normal-Gamma linear regression: each record's exact site, the packed triangle of z z^T
    for z = (x, y), clipped to C and released as one PSD block, Delta = sqrt(2) C / S (module docstring,
    "Normal-Gamma sites"); no public parameters."""

    name = "dpsep-linreg"

    def __init__(self, clip: float) -> None:
        self.clip = checked_clip(clip)

    def blocks(self, dimension: int) -> tuple[Block, ...]:
        return (Block(BLOCK, self.clip, nonnegative_or_psd=True),)

    def validate_params(self, params: dict[str, Array], dimension: int) -> None:
        if params:
            raise ValueError(f"{self.name} takes no public parameters (its sites do not depend on q)")

    def clipped_sums(
        self, batch: Batch, params: dict[str, Array], rng: np.random.Generator
    ) -> dict[str, Array]:
        """Per-record clipped contributions summed chunk by chunk (base.chunked_sums)."""
        return chunked_sums(batch, self._chunk_sums)

    def _chunk_sums(self, batch: Batch) -> dict[str, Array]:
        x, y = bounded_records(batch, self.name)
        z = np.column_stack([x, y])
        # Warnings silenced: a zero row's factor C / tiny overflows (then capped at 1), tiny entries' fourth
        # powers underflow, and a warning's presence would depend on the data.
        with np.errstate(all="ignore"):
            squares = z * z
            length2 = squares.sum(axis=1)
            # ||P(z z^T)||^2 = (||z||^4 + sum_i z_i^4) / 2 (module docstring).
            norms = np.sqrt((length2 * length2 + (squares * squares).sum(axis=1)) / 2.0)
            factors = clip_factors(norms, self.clip)
            return {BLOCK: upper_triangle((z * factors[:, None]).T @ z)}

    def postprocess(self, noised_means: dict[str, Array], dimension: int) -> dict[str, Array]:
        """Mirror z z^T's mean, project it to the PSD cone, and split it into xx, yx and yy."""
        return split_joint(project_psd(symmetric_from_upper(noised_means[BLOCK], dimension + 1)))
