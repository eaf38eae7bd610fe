"""The sigmoid belief network's E-step with Polya-Gamma augmentation (VIPS paper Sec. 7, Alg. 6, Appendix 4).

Model (paper Eq. 60-64): visible y_n in {0,1}^J, hidden z_n in {0,1}^K,
p(y_nj = 1 | z_n) = sigmoid(psi_nj), psi_nj = w_j^T z_n + c_j, p(z_nk = 1) = sigmoid(b_k). Code names:
``w_mean`` = <W> (J x K, row j is <w_j>), ``b_mean`` = <b>, ``second_moment[j]`` = <w^_j w^_j^T> for the
augmented row w^_j = (w_j, c_j) (K + 1 x K + 1: its last row and column hold <w_jk c_j> and <c_j^2>).
These are the expected natural parameters n(theta) of the paper (Eq. 65) that the E-step needs.

E-step per record, a FIXED number of rounds (never a convergence test: control flow that depends on data
would leak), starting from q(z_nk = 1) = sigmoid(<b_k>), and ending with a PG update:
  PG means (Eq. 67)   xi_nj = E[PG(1, sqrt(<psi_nj^2>))] = tanh(c/2) / (2c),  c = sqrt(<psi_nj^2>),
                      <psi_nj^2> = r^_n^T M_j r^_n + sum_k M_j,kk (r_nk - r_nk^2),  r^_n = (r_n, 1);
  hidden units (Eq. 69-71), k = 1..K in turn (coordinate ascent; vectorised over the batch),
                      r_nk = q(z_nk = 1) = sigmoid(d_nk),
                      d_nk = <b_k> + sum_j (y_nj - 1/2) <w_jk>
                             - 1/2 sum_j xi_nj (M_j,kk + 2 sum_{l != k} M_j,kl r_nl + 2 M_j,kK).
Here r_n = <z_n> (the paper's sigmoid(d_n)) and xi_n = <xi^(0)_n>. The PG variables xi^(1) of b depend on
q(b) only (Eq. 68): they are post-processing of released values and are not released (the paper's s2).

Released blocks (per-record contribution, its L2 bound C, and the replace-one sensitivity of the batch mean;
each contribution is clipped to C with clip_factors, a no-op for y in {0,1}^J). Every statistic is released
centred at the middle of the box its entries lie in, so each is a signed block with Delta = 2 C / S:

  s1 = r_n - 1/2                  (K)            r_nk in [0, 1]: C1 = sqrt(K) / 2, Delta1 = sqrt(K) / S
                                                 (the paper's sqrt(K) / N, Appendix Eq. 79).
  s3 = y_n - 1/2                  (J)            C3 = sqrt(J) / 2, Delta3 = sqrt(J) / S (Eq. 80).
  s4 = xi_n - 1/8                 (J)            xi_nj in [0, 1/4]: C4 = sqrt(J) / 8,
                                                 Delta4 = sqrt(J) / (4 S) (Eq. 81).
  s5 = xi_n r_n^T - 1/8           (J x K)        entries xi_nj r_nk in [0, 1/4]: C5 = sqrt(J K) / 8,
                                                 Delta5 = sqrt(J K) / (4 S) (Eq. 82).
  s6 = (y_n - 1/2) (r_n - 1/2)^T  (J x K)        entries in [-1/4, 1/4]: C6 = sqrt(J K) / 4,
                                                 Delta6 = sqrt(J K) / (2 S). The paper's z (y - 1/2)^T
                                                 (transposed) is s6 + s3 1^T / 2 (postprocess): r centred
                                                 at its box's middle halves the diameter of the entries'
                                                 box ([-1/2, 1/2] for (y - 1/2) r^T, Delta sqrt(J K) / S;
                                                 y z^T, non-negative, C = sqrt(J K): sqrt(2 J K) / S), so
                                                 a quarter of the noise variance on the weights' drive.
  s7 = xi_nj triu(<z_n z_n^T>)    (J x K(K+1)/2) <z_n z_n^T> = r_n r_n^T + diag(r_n - r_n^2) (z binary): its
       - 1/8                                     upper triangle with the diagonal, row-major per j, entries
                                                 r_nk (diagonal) and r_nk r_nl, so xi_nj times them lies in
                                                 [0, 1/4]: C7 = sqrt(J K (K+1) / 2) / 8,
                                                 Delta7 = sqrt(J K (K+1) / 2) / (4 S). (The paper bounds the
                                                 full K x K matrices: sqrt(J) K / (4N), Eq. 84; the packed
                                                 triangle is what is released, mirroring it is
                                                 post-processing.)

Why centre: for u, v in a box [0, a]^d, |u - v| <= a sqrt(d), attained by u = 0, v = a 1. Released as
non-negative blocks (C = a sqrt(d), Delta = sqrt(2) C / S) s4, s5 and s7 would get sqrt(2) times that; centred
at a/2 (C = a sqrt(d) / 2, signed, Delta = 2 C / S = a sqrt(d) / S) they get exactly the box's diameter.
(The "- 1/8" is subtracted from every entry.) Each Delta is (nearly) attained: the audit in
tests/privacy_wall/queries/test_sbn.py reaches 0.90 (s1) to 1.0 (s3, s6) of them with the all-ones and
all-zeros images under saturating parameters. postprocess adds the public centres back, and s3 / 2 to s6
(a function of released values only).

With s6 as postprocess returns it, <(y_n - 1/2) r_n^T>, and together with the public prior these are the
natural-parameter updates of q(w^_j) = N (paper Appendix
Sec. 5, with w_j and c_j in one Gaussian per visible unit): precision_j = prior + N [[s7_j, s5_j],
[s5_j^T, s4_j]], precision_j mean_j = N (s6_j, s3_j); and of q(b): precision = 1/nu_b + N <xi^(1)>,
precision mean = N s1.

Weighting the pixel frequencies (frequency_copies = k, public, fixed per job; issue 35). s3 is released k
times: blocks s3, s3_2, ..., s3_k, identical sums of the same clipped contributions (y_n - 1/2), each with C3
and Delta3 = sqrt(J) / S. Sensitivity: the release is the gate's one Gaussian mechanism over B = 5 + k blocks,
each divided by its Delta_b; a replacement moves each normalised block by at most 1 (its own bound, every copy
exactly as s3 does), so the concatenation moves by at most sqrt(B) = sqrt(5 + k), the gate's default J (no
smaller joint sensitivity is declared). All-ones against all-zeros moves every copy by exactly 1, so the
copies alone reach sqrt(k) of it (tests/privacy_wall/queries/test_sbn.py). Noise: N(0, (5 + k) sigma^2) per
normalised coordinate; postprocess averages the copies (post-processing), so s3 gets std sqrt(5 + k) sigma
Delta3 / sqrt(k) and every other block sqrt(5 + k) sigma Delta_b. This is the jointly clipped release with s3
scaled by sqrt(k) (sensitivity sqrt(5 + k)), written as copies so that every block the gate sees keeps a Delta
that a replacement reaches. Against k = 1 (sqrt(6) for every block), s3's noise variance is (5 + k) / (6 k)
times as large (k = 4: 0.375) and the others' (5 + k) / 6 (k = 4: 1.5): the fallback to the pixel frequencies,
which is what a private fit is worth at small epsilon x N, pays s3's noise only. A job that gives epsilon but
not k gets the schedule rule's k for its epsilon x N (docs/schedules.md, "VIPS-SBN").

Any finite public parameters are accepted; overflow and non-PSD moments cannot push a record outside its
bounds (NaN is mapped to a value inside them), and floating-point warnings are silenced because a warning's
presence would depend on the data.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import expit

from privacy_wall.data.store import Batch
from privacy_wall.noise.mechanisms import clip_factors
from privacy_wall.queries.base import Array, Block
from privacy_wall.queries.blr import polya_gamma_mean

#: Rounds of (PG update, sweep over the hidden units) per record, then a final PG update.
DEFAULT_INNER_ITERATIONS = 5

#: Rows per chunk of clipped_sums: bounds the chunk x K x K arrays of the E-step (~80 MB at K = 100).
CHUNK_ROWS = 1024

#: The middle of [0, 1/4], the range of the entries of s4, s5 and s7, at which they are released.
PG_CENTRE = 0.125

PARAM_NAMES = frozenset({"b_mean", "w_mean", "second_moment"})

#: Copies of s3 in each release when neither the job nor the schedule rule gives them (frequency_copies;
#: module docstring, "Weighting the pixel frequencies").
DEFAULT_FREQUENCY_COPIES = 4


def frequency_copy_names(copies: int) -> tuple[str, ...]:
    """Block names of the extra copies of s3: s3_2, ..., s3_k (none for k = 1)."""
    return tuple(f"s3_{i}" for i in range(2, copies + 1))


def _bernoulli_mean(logits: Array) -> Array:
    """sigmoid(d), with NaN (inf - inf from extreme parameters) mapped to 1/2: any value in [0,1] keeps
    every bound, and a NaN would propagate into the release."""
    return np.where(np.isnan(logits), 0.5, expit(logits))


def _pg_means(r: Array, m_packed: Array, m_zc: Array, m_cc: Array) -> Array:
    """xi_nj = E[PG(1, sqrt(<psi_nj^2>))] for all records n and visible units j (S x J).

    <psi_nj^2> = sum_{k <= l} (2 - [k = l]) M_j,kl <z_nk z_nl> + 2 r_n^T M_j[:K, K] + M_j,KK, with
    <z_nk^2> = r_nk; `m_packed` holds (2 - [k = l]) M_j,kl on the packed upper triangle (K(K+1)/2 x J).
    """
    quad = packed_hidden_moment(r) @ m_packed + 2.0 * (r @ m_zc.T) + m_cc
    # Overflow can give inf - inf = NaN; treat it as c = inf (xi = 0). Non-PSD moments give quad < 0: c = 0.
    quad = np.where(np.isnan(quad), np.inf, quad)
    xi: Array = polya_gamma_mean(np.sqrt(np.maximum(quad, 0.0)))
    return xi


def hidden_posterior(
    y: Array, b_mean: Array, w_mean: Array, second_moment: Array, iterations: int
) -> tuple[Array, Array]:
    """The local E-step: (r, xi) with r_nk = q(z_nk = 1) (S x K) and xi_nj = <xi^(0)_nj> (S x J).

    Vectorised over the batch; loops over the K hidden units (coordinate ascent) and the fixed number of
    rounds only. Used behind the wall on sensitive rows, and outside it on public rows for reconstruction.
    """
    size = y.shape[0]
    hidden = b_mean.shape[0]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        moment = (second_moment + np.swapaxes(second_moment, 1, 2)) / 2.0
        rows, cols = np.triu_indices(hidden)
        # (2 - [k = l]) M_j,kl on the packed upper triangle, transposed for the product in _pg_means.
        m_packed = np.ascontiguousarray((np.where(rows == cols, 1.0, 2.0) * moment[:, rows, cols]).T)
        m_zz = moment[:, :hidden, :hidden].reshape(-1, hidden * hidden)
        m_zc = moment[:, :hidden, hidden]
        m_cc = moment[:, hidden, hidden]
        linear = b_mean + (y - 0.5) @ w_mean  # <b_k> + sum_j (y_nj - 1/2) <w_jk>
        r = np.tile(_bernoulli_mean(b_mean), (size, 1))
        xi = _pg_means(r, m_packed, m_zc, m_cc)
        for _ in range(iterations):
            pair = (xi @ m_zz).reshape(size, hidden, hidden)  # sum_j xi_nj M_j[:K, :K]
            bias = xi @ m_zc  # sum_j xi_nj M_j,kK
            for k in range(hidden):
                others = np.einsum("nl,nl->n", pair[:, k, :], r) - pair[:, k, k] * r[:, k]
                d = linear[:, k] - 0.5 * pair[:, k, k] - others - bias[:, k]
                r[:, k] = _bernoulli_mean(d)
            xi = _pg_means(r, m_packed, m_zc, m_cc)
    return r, xi


def _centred_outer_norm(xi: Array, v: Array) -> Array:
    """|xi_n v_n^T - 1/8|_F per record, from |.|^2 = |xi|^2 |v|^2 - (1/4) sum(xi) sum(v) + J dim(v) / 64
    (no S x J x dim(v) array). Rounding can leave a tiny negative square: floored at 0."""
    square = (
        np.einsum("nj,nj->n", xi, xi) * np.einsum("nk,nk->n", v, v)
        - 2.0 * PG_CENTRE * xi.sum(axis=1) * v.sum(axis=1)
        + PG_CENTRE**2 * xi.shape[1] * v.shape[1]
    )
    norm: Array = np.sqrt(np.maximum(square, 0.0))
    return norm


def packed_hidden_moment(r: Array) -> Array:
    """triu(<z_n z_n^T>) per record (S x K(K+1)/2): r_nk r_nl off the diagonal, r_nk on it."""
    hidden = r.shape[1]
    rows, cols = np.triu_indices(hidden)
    packed = r[:, rows] * r[:, cols]
    diagonal = rows == cols
    packed[:, diagonal] = r
    return packed


def mirror_packed(packed: Array, hidden: int) -> Array:
    """(..., K(K+1)/2) upper triangles to (..., K, K) symmetric matrices."""
    rows, cols = np.triu_indices(hidden)
    out = np.zeros((*packed.shape[:-1], hidden, hidden))
    out[..., rows, cols] = packed
    out[..., cols, rows] = packed
    return out


class SigmoidBeliefNetworkQuery:
    """The wall's half of VIPS-SBN: K hidden units, a fixed number of inner rounds per record."""

    name = "sbn"

    def __init__(
        self,
        hidden: int,
        inner_iterations: int = DEFAULT_INNER_ITERATIONS,
        frequency_copies: int = DEFAULT_FREQUENCY_COPIES,
    ) -> None:
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise ValueError("hidden must be an integer >= 1")
        if (
            isinstance(inner_iterations, bool)
            or not isinstance(inner_iterations, int)
            or inner_iterations < 1
        ):
            raise ValueError("inner_iterations must be an integer >= 1")
        if (
            isinstance(frequency_copies, bool)
            or not isinstance(frequency_copies, int)
            or not 1 <= frequency_copies <= 64
        ):
            raise ValueError("frequency_copies must be an integer in [1, 64]")
        self.hidden = hidden
        self.inner_iterations = inner_iterations
        self.frequency_copies = frequency_copies

    def bounds(self, dimension: int) -> dict[str, float]:
        """Per-record L2 bounds C_b of the released blocks (module docstring): six statistics, s3 in
        frequency_copies identical blocks."""
        j, k = dimension, self.hidden
        out = {
            "s1": math.sqrt(k) / 2.0,
            "s3": math.sqrt(j) / 2.0,
            "s4": math.sqrt(j) / 8.0,
            "s5": math.sqrt(j * k) / 8.0,
            "s6": math.sqrt(j * k) / 4.0,
            "s7": math.sqrt(j * k * (k + 1) / 2.0) / 8.0,
        }
        out.update(dict.fromkeys(frequency_copy_names(self.frequency_copies), out["s3"]))
        return out

    def blocks(self, dimension: int) -> tuple[Block, ...]:
        """Signed blocks (contributions centred in their boxes): Delta_b = 2 C_b / S."""
        return tuple(Block(name, bound) for name, bound in self.bounds(dimension).items())

    def validate_params(self, params: dict[str, Array], dimension: int) -> None:
        if set(params) != PARAM_NAMES:
            raise ValueError("sbn takes exactly the public parameters b_mean, w_mean and second_moment")
        j, k = dimension, self.hidden
        shapes = {"b_mean": (k,), "w_mean": (j, k), "second_moment": (j, k + 1, k + 1)}
        for name, shape in shapes.items():
            value = params[name]
            if value.shape != shape or not np.isfinite(value).all():
                raise ValueError(f"{name} must be a finite array of shape {shape}")

    def clipped_sums(
        self, batch: Batch, params: dict[str, Array], rng: np.random.Generator
    ) -> dict[str, Array]:
        """Per-block sums of the clipped, centred contributions. Rows are processed in chunks of CHUNK_ROWS
        (a count fixed by the public S) to bound the S x K x K working memory; records are independent, so
        chunking changes nothing but the order of the sums."""
        del rng  # the E-step is deterministic
        y = batch.features
        bounds = self.bounds(y.shape[1])
        parts = [
            self._chunk_sums(y[start : start + CHUNK_ROWS], params, bounds)
            for start in range(0, max(y.shape[0], 1), CHUNK_ROWS)
        ]
        sums = {name: np.sum([part[name] for part in parts], axis=0) for name in parts[0]}
        for name in frequency_copy_names(self.frequency_copies):
            sums[name] = sums["s3"].copy()
        return sums

    def _chunk_sums(self, y: Array, params: dict[str, Array], bounds: dict[str, float]) -> dict[str, Array]:
        r, xi = hidden_posterior(
            y, params["b_mean"], params["w_mean"], params["second_moment"], self.inner_iterations
        )
        with np.errstate(over="ignore", invalid="ignore"):
            centred_r = r - 0.5
            centred_y = y - 0.5
            packed = packed_hidden_moment(r)
            norm_r = np.linalg.norm(centred_r, axis=1)
            norm_y = np.linalg.norm(centred_y, axis=1)
            f1 = clip_factors(np.linalg.norm(centred_r, axis=1), bounds["s1"])
            f3 = clip_factors(norm_y, bounds["s3"])
            f4 = clip_factors(np.linalg.norm(xi - PG_CENTRE, axis=1), bounds["s4"])
            f5 = clip_factors(_centred_outer_norm(xi, r), bounds["s5"])
            f6 = clip_factors(norm_y * norm_r, bounds["s6"])
            f7 = clip_factors(_centred_outer_norm(xi, packed), bounds["s7"])
            return {
                "s1": centred_r.T @ f1,
                "s3": centred_y.T @ f3,
                "s4": (xi - PG_CENTRE).T @ f4,
                "s5": ((xi * f5[:, None]).T @ r - PG_CENTRE * f5.sum()).reshape(-1),
                "s6": ((centred_y * f6[:, None]).T @ centred_r).reshape(-1),
                "s7": ((xi * f7[:, None]).T @ packed - PG_CENTRE * f7.sum()).reshape(-1),
            }

    def postprocess(self, noised_means: dict[str, Array], dimension: int) -> dict[str, Array]:
        """Data-independent: s3 is the mean of its frequency_copies released copies (equal noise
        scales: the minimum-variance combination); add the centre 1/8 back to s4, s5, s7 (so they are batch
        means of xi_n, xi_n r_n^T and xi_nj <z_n z_n^T>); add s3 / 2 to each column of s6 (then the batch
        mean of (y_n - 1/2) r_n^T: released values only); reshape s5, s6 to J x K and mirror s7 to
        J x K x K. s1 and s3 stay centred (the M-step uses r - 1/2 and y - 1/2)."""
        j, k = dimension, self.hidden
        copies = ("s3", *frequency_copy_names(self.frequency_copies))
        s3 = (
            np.mean([noised_means[name] for name in copies], axis=0)
            if len(copies) > 1
            else noised_means["s3"]
        )
        return {
            "s1": noised_means["s1"],
            "s3": s3,
            "s4": noised_means["s4"] + PG_CENTRE,
            "s5": noised_means["s5"].reshape(j, k) + PG_CENTRE,
            "s6": noised_means["s6"].reshape(j, k) + s3[:, None] / 2.0,
            "s7": mirror_packed(noised_means["s7"].reshape(j, k * (k + 1) // 2) + PG_CENTRE, k),
        }
