"""Latent Dirichlet allocation, public half (VIPS paper Sec. 4, Alg. 3; Hoffman, Blei, Bach 2010).

Topics beta_k ~ Dirichlet(eta 1_V), q(beta_k) = Dirichlet(lambda_k) [lam]. From a released batch mean s
(K x V, negatives already set to 0 by the wall):
  lambda_hat = eta + D s                                 (D the number of documents, public)
  lambda_t   = (1 - rho_t) lambda_{t-1} + rho_t lambda_hat
Expected natural parameters for the next E-step: E[log beta_kv] = digamma(lambda_kv) - digamma(sum_v
lambda_kv). Everything here runs on released values or public documents only: top words, topic
proportions of new documents (the E-step with a fixed number of iterations) and held-out perplexity.

With the wall's unigram block (privacy_wall.queries.lda, unigram_share > 0) the release also carries u,
the batch mean of each document's clipped word counts, and s keeps its negative entries. The M-step then
(post-processing: it reads only the released s and u, their noise stds, D, K, V and the public seed):
  - averages the u releases with inverse-variance weights; the unigram p_u is max(u_bar, 0) plus one noise
    std of u_bar per word, normalised;
  - mixes the raw D s as above into X (rho_t), tracking X's per-entry noise variance v from the stds;
  - per topic, n_k = sum_v X_kv, r = X_k - n_k p_u, and the topic's counts are m_k p_u + soft(r, t), with
    m_k = n_k floored at 3 noise stds of that sum and the universal threshold t = sqrt(v) sqrt(2 log(K V)),
    all floored at 0: when s is pure noise nothing survives the threshold and every topic is the unigram;
    at sigma = 0 (v = 0) the counts are X itself;
  - lambda = eta + those counts; the next E-step's E[log beta] is that of lambda times the initial state's
    Gamma(100, 1/100) jitter (public_params), which keeps the topics apart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.special import digamma, gammaln

from privacy_wall.queries.lda import Counts, fit_documents
from worker.models.base import Array

#: Fixed E-step iterations for documents outside the wall (prediction and evaluation).
EVALUATION_ITERATIONS = 100


@dataclass(frozen=True)
class LdaState:
    """q(beta) = prod_k Dirichlet(lam_k) (lam: K x V) and the last released statistics."""

    lam: Array
    statistics: dict[str, Array]
    #: With the unigram block: the raw mixed D s (K x V) and its per-entry noise variance, the
    #: inverse-variance sums of the u releases, and the initial jitter (module docstring).
    raw: Array | None = None
    raw_variance: float = 0.0
    unigram_sum: Array | None = None
    unigram_weight: float = 0.0

    @property
    def topics(self) -> int:
        return int(self.lam.shape[0])


def expected_log_beta(lam: Array) -> Array:
    """E[log beta_kv] = digamma(lambda_kv) - digamma(sum_v lambda_kv) under Dirichlet(lambda_k)."""
    out: Array = digamma(lam) - digamma(lam.sum(axis=1, keepdims=True))
    return out


def topic_word_probabilities(lam: Array) -> Array:
    """E[beta_kv] = lambda_kv / sum_v lambda_kv."""
    out: Array = lam / lam.sum(axis=1, keepdims=True)
    return out


def top_words(lam: Array, count: int = 10) -> list[list[int]]:
    """Per topic, the ids of its `count` most probable words, most probable first."""
    count = min(count, lam.shape[1])
    order = np.argsort(-lam, axis=1, kind="stable")[:, :count]
    return [[int(v) for v in row] for row in order]


@dataclass(frozen=True)
class LatentDirichletAllocation:
    """VIPS-LDA's public half with K topics, priors alpha (on theta) and eta (on beta).

    alpha and eta default to 1/K (as in Hoffman et al.'s onlineldavb, scikit-learn and gensim). The initial
    lambda is Gamma(100, 1/100) noise (mean 1), drawn from a public seed: a symmetric start would keep every
    topic identical forever.
    """

    topics: int = 10
    alpha: float | None = None
    eta: float | None = None
    seed: int = 0
    name: str = "lda"

    def __post_init__(self) -> None:
        if self.topics < 1:
            raise ValueError("topics must be >= 1")
        for label, value in (("alpha", self.alpha), ("eta", self.eta)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{label} must be a finite number > 0")

    @property
    def doc_topic_prior(self) -> float:
        return 1.0 / self.topics if self.alpha is None else float(self.alpha)

    @property
    def topic_word_prior(self) -> float:
        return 1.0 / self.topics if self.eta is None else float(self.eta)

    def initial_state(self, dimension: int) -> LdaState:
        rng = np.random.default_rng(self.seed)
        return LdaState(rng.gamma(100.0, 0.01, size=(self.topics, dimension)), {})

    def public_params(self, state: LdaState) -> dict[str, Array]:
        if state.raw is not None:  # the unigram M-step: the E-step sees lambda times the initial jitter
            return {
                "expected_log_beta": expected_log_beta(state.lam * self.initial_state(state.lam.shape[1]).lam)
            }
        return {"expected_log_beta": expected_log_beta(state.lam)}

    def m_step(
        self,
        state: LdaState,
        statistics: dict[str, Array],
        population: int,
        rho: float,
        noise_std: Mapping[str, float] | None = None,
    ) -> LdaState:
        s = np.asarray(statistics["s"], dtype=np.float64).reshape(state.lam.shape)
        if "u" in statistics:
            return self._unigram_m_step(state, statistics, population, rho, noise_std or {})
        lam_hat = self.topic_word_prior + population * s
        lam = (1.0 - rho) * state.lam + rho * lam_hat
        return LdaState(lam, {"s": s})

    def _unigram_m_step(
        self,
        state: LdaState,
        statistics: dict[str, Array],
        population: int,
        rho: float,
        noise_std: Mapping[str, float],
    ) -> LdaState:
        """The M-step with the unigram block (module docstring)."""
        topics, words = state.lam.shape
        s = np.asarray(statistics["s"], dtype=np.float64).reshape(topics, words)
        u = np.asarray(statistics["u"], dtype=np.float64).reshape(words)
        s_std, u_std = float(noise_std.get("s", 0.0)), float(noise_std.get("u", 0.0))
        x = population * s
        if state.raw is None:
            raw, variance = x, (population * s_std) ** 2
        else:
            raw = (1.0 - rho) * state.raw + rho * x
            variance = (1.0 - rho) ** 2 * state.raw_variance + (rho * population * s_std) ** 2
        # Inverse-variance average of u (equal weights when noiseless).
        weight = 1.0 / u_std**2 if u_std > 0 else 1.0
        unigram_sum = weight * u + (0.0 if state.unigram_sum is None else state.unigram_sum)
        unigram_weight = weight + state.unigram_weight
        u_bar = unigram_sum / unigram_weight
        u_bar_std = math.sqrt(1.0 / unigram_weight) if u_std > 0 else 0.0
        p_u = np.maximum(u_bar, 0.0) + max(u_bar_std, 1e-12 * float(np.abs(u_bar).max(initial=1.0)))
        p_u /= p_u.sum()
        # A topic's token mass; its counts start from the mass floored at 3 noise stds of that sum (a topic
        # whose mass is noise is the unigram), the residual is taken against the mass itself.
        total = raw.sum(axis=1, keepdims=True)
        mass = np.maximum(total, 3.0 * math.sqrt(variance * words))
        residual = raw - total * p_u[None, :]
        threshold = math.sqrt(variance) * math.sqrt(2.0 * math.log(max(2, topics * words)))
        shrunk = np.sign(residual) * np.maximum(np.abs(residual) - threshold, 0.0)
        counts = np.maximum(mass * p_u[None, :] + shrunk, 0.0)
        lam = self.topic_word_prior + counts
        return LdaState(lam, {"s": s, "u": u}, raw, variance, unigram_sum, unigram_weight)

    def posterior(self, state: LdaState) -> dict[str, Any]:
        """Natural parameters E[log beta], the last released s, the variational lambda, and per topic its
        20 most probable word ids with their probabilities E[beta_kv] ("topics"; the vocabulary maps ids
        to words)."""
        probabilities = topic_word_probabilities(state.lam)
        tops = top_words(state.lam, 20)
        lam = state.lam.tolist()  # one list under both keys: worker.posterior writes its text once
        return {
            "natural_parameters": {"expected_log_beta": expected_log_beta(state.lam).tolist()},
            "sufficient_statistics": {k: v.tolist() for k, v in state.statistics.items()},
            "variational_parameters": {
                "lambda": lam,
                "alpha": self.doc_topic_prior,
                "eta": self.topic_word_prior,
            },
            "lambda": lam,
            "topics": [
                {"word_ids": ids, "probabilities": [float(probabilities[k, v]) for v in ids]}
                for k, ids in enumerate(tops)
            ],
        }


# --------------------------------------------------------------------------------------------------------
# Public documents: topic proportions and held-out perplexity.


def document_topics(
    lam: Array, counts: Counts, alpha: float, iterations: int = EVALUATION_ITERATIONS
) -> Array:
    """Topic proportions E[theta_d] = gamma_d / sum_k gamma_dk of the rows of `counts`; rows sum to 1."""
    gamma = fit_documents(counts, expected_log_beta(lam), alpha, iterations).gamma
    out: Array = gamma / gamma.sum(axis=1, keepdims=True)
    return out


def split_documents(counts: Counts, seed: int = 0) -> tuple[Counts, Counts]:
    """Document completion's split: each document's tokens are shuffled (seeded) and divided into an
    observed half (floor(N_d / 2) tokens) and a held-out half (the rest). Rows are kept (a one-token
    document has an empty observed half)."""
    matrix = sp.csr_array(counts, copy=True)
    matrix.sum_duplicates()
    data = np.asarray(matrix.data, dtype=np.int64)
    rng = np.random.default_rng(seed)
    rows, cols = matrix.shape
    cumulative = np.concatenate([[0], np.cumsum(data)])
    lengths = cumulative[matrix.indptr[1:]] - cumulative[matrix.indptr[:-1]]
    # One token per count: (entry index) repeated; a random key per token orders the tokens of a row.
    token_entry = np.repeat(np.arange(data.size), data)
    token_row = np.repeat(np.repeat(np.arange(rows), np.diff(matrix.indptr)), data)
    keys = rng.random(token_entry.size)
    order = np.lexsort((keys, token_row))
    rank = np.empty(order.size, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    rank[order] = np.arange(order.size) - np.repeat(starts, lengths)
    observed_token = rank < (lengths // 2)[token_row]
    observed = np.bincount(token_entry[observed_token], minlength=data.size)
    held_out = data - observed

    def build(values: np.ndarray[Any, np.dtype[np.int64]]) -> Counts:
        out = sp.csr_array((values, matrix.indices.copy(), matrix.indptr.copy()), shape=(rows, cols))
        out.eliminate_zeros()
        return out

    return build(observed), build(held_out)


def completion_perplexity(
    lam: Array,
    observed: Counts,
    held_out: Counts,
    alpha: float,
    iterations: int = EVALUATION_ITERATIONS,
) -> float:
    """Document-completion perplexity (Wallach et al. 2009): theta_d = E[theta_d] fitted on the observed
    half, each held-out token scored by p(w) = sum_k theta_dk E[beta_kw];
    exp(-sum log p(w) / number of held-out tokens). Documents with an empty observed half get theta from
    the prior alone (the uniform mean)."""
    theta = document_topics(lam, observed, alpha, iterations)
    beta = topic_word_probabilities(lam)
    held = sp.csr_array(held_out)
    rows = np.repeat(np.arange(held.shape[0]), np.diff(held.indptr))
    probabilities = np.einsum("ik,ki->i", theta[rows], beta[:, held.indices])
    tokens = float(held.data.sum())
    return math.exp(-float(np.dot(held.data, np.log(probabilities))) / tokens)


def perplexity_bound(
    lam: Array, counts: Counts, alpha: float, iterations: int = EVALUATION_ITERATIONS
) -> float:
    """The paper's held-out perplexity bound (Eq. 32; Hoffman, Blei, Bach 2010):
    exp(-sum_d ELBO_d / sum_d N_d), ELBO_d = E_q[log p(n_d, theta_d, z_d | beta)] - E_q[log q(theta_d, z_d)]
    with q(beta) = Dirichlet(lambda) from training and q(theta_d, z_d) from the E-step on the test document:
      ELBO_d = sum_v n_dv log sum_k exp(E[log theta_dk] + E[log beta_kv])
               + sum_k (alpha - gamma_dk) E[log theta_dk] + sum_k (log Gamma(gamma_dk) - log Gamma(alpha))
               + log Gamma(K alpha) - log Gamma(sum_k gamma_dk)
    (the first line is the z and w terms at the optimal phi). An upper bound on the true perplexity."""
    fit = fit_documents(counts, expected_log_beta(lam), alpha, iterations)
    gamma = fit.gamma
    topics = gamma.shape[1]
    elog_theta = digamma(gamma) - digamma(gamma.sum(axis=1, keepdims=True))
    theta_terms = (
        ((alpha - gamma) * elog_theta).sum(axis=1)
        + (gammaln(gamma) - gammaln(alpha)).sum(axis=1)
        + gammaln(topics * alpha)
        - gammaln(gamma.sum(axis=1))
    )
    tokens = float(sp.csr_array(counts).sum())
    return math.exp(-float((fit.log_normaliser + theta_terms).sum()) / tokens)


def unigram_perplexity(train: Counts, test: Counts, smoothing: float = 0.5) -> float:
    """The empirical word-frequency baseline (add-`smoothing`), scored on every token of `test`."""
    frequency = np.asarray(sp.csr_array(train).sum(axis=0), dtype=np.float64) + smoothing
    log_p = np.log(frequency / frequency.sum())
    held = sp.csr_array(test)
    return math.exp(-float(np.dot(held.data, log_p[held.indices])) / float(held.data.sum()))
