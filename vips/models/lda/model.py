"""Latent Dirichlet allocation, public half (VIPS paper Sec. 4, Alg. 3; Hoffman, Blei, Bach 2010).

Topics beta_k ~ Dirichlet(eta 1_V), q(beta_k) = Dirichlet(lambda_k) [lam]. From a released batch mean s
(K x V, negatives already set to 0 by the wall):
  lambda_hat = eta + D s + (f / K) sum_j D s_j           (D the number of documents, public; f below)
  lambda_t   = (1 - rho_t) lambda_{t-1} + rho_t lambda_hat
Expected natural parameters for the next E-step: E[log beta_kv] = digamma(lambda_kv) - digamma(sum_v
lambda_kv). Everything here runs on released values or public documents only: top words, topic
proportions of new documents (the E-step with a fixed number of iterations) and held-out perplexity.

With the wall's unigram block (privacy_wall.queries.lda, unigram_share > 0) the release also carries u,
the batch mean of each document's clipped word counts, and s keeps its negative entries. The M-step then
(post-processing: it reads only the released s and u, their noise stds, D, K, V and the public seed):
  - averages the u releases with inverse-variance weights into u_bar; the unigram p_u is each word's
    posterior mean under an empirical-Bayes prior fitted to all of u_bar (`unigram_estimate`), normalised;
    with a public word-frequency prior p0 (word_prior) the empirical-Bayes prior is a log-normal
    regression on log p0 instead (vips.models.lda.word_prior.prior_unigram_estimate);
  - mixes the raw D s as above into X (rho_t), tracking X's per-entry noise variance v from the stds;
  - per topic, n_k = sum_v X_kv, r = X_k - n_k p_u, and the topic's counts are m_k p_u + hard(r, t) (r_kv
    where |r_kv| > t, else 0), with m_k = n_k floored at 3 noise stds of that sum and t = sqrt(v) z, z the
    Bonferroni threshold for K V entries (`keep_threshold`: an M-step keeps any pure-noise entry with
    probability at most 1%), all floored at 0: when s is pure noise nothing survives the threshold and
    every topic is the unigram; at sigma = 0 (v = 0) the counts are X itself. Hard, not soft
    (sign(r) max(|r| - t, 0)): an excess that clears t keeps its size. With a few thousand documents the
    excesses that clear t are a few t, and soft thresholding took most of each away (planted topics, D
    3,000, epsilon 10: 10-12% below the unigram instead of 6%; docs/schedules.md, "VIPS-LDA");
  - lambda = eta + those counts; the next E-step's E[log beta] is that of lambda times the initial state's
    Gamma(100, 1/100) jitter (public_params), which keeps the topics apart.

Both M-steps then pull the topics towards the corpus's word frequencies (`smoothing` f; 0, the model's
default, is the paper's M-step; a job's default is `default_smoothing(doc_length)`): with X the topic
counts they form (D s, or the fallback's counts above),
  lambda_kv = eta + X_kv + (f / K) sum_j X_jv,
a Dirichlet prior on each topic centred on the word frequencies X implies, weighing f times a mean topic's
mass. Resampling to N_w tokens counts a document of L tokens N_w / L times over, so lambda = eta + X
alone is far too sure of every topic's rare words (issue 36: on the bundled Wikipedia corpus at sigma 0,
held-out completion perplexity 3.8% below the unigram's at f 0 and 26% below at f 0.2).
Post-processing like the rest: it reads only the released values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.special import digamma, gammaln, ndtri

from privacy_wall.queries.lda import Counts, fit_documents
from vips.models.base import Array

#: Fixed E-step iterations for documents outside the wall (prediction and evaluation).
EVALUATION_ITERATIONS = 100
#: A job's pull of the topics towards the corpus's word frequencies when documents are resampled (module
#: docstring); read off the bundled Wikipedia corpus and planted-topic and stand-in corpora
#: (docs/schedules.md, "The M-step's pull towards the word frequencies").
SMOOTHING = 0.2


def default_smoothing(doc_length: int) -> float:
    """f when a job does not give it: SMOOTHING for resampled documents (doc_length N_w > 0); 0, the
    paper's M-step, for documents kept as they are (there lambda = eta + D s is exact variational Bayes)."""
    return SMOOTHING if doc_length > 0 else 0.0


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
    #: Whether the u releases carry noise (their weights are then 1 / std^2).
    unigram_noisy: bool = False

    @property
    def topics(self) -> int:
        return int(self.lam.shape[0])


#: The unigram M-step keeps a topic's excess over the unigram where it clears a threshold at which an
#: M-step keeps any entry of pure noise with at most this probability (`keep_threshold`).
NOISE_KEPT = 0.01


def keep_threshold(entries: int) -> float:
    """The threshold in noise stds, z = Phi^-1(1 - NOISE_KEPT / (2 n)) for n entries: by the union bound
    the chance that any of n independent N(0, 1) exceeds it in absolute value is at most NOISE_KEPT (5.49 at
    K V = 250,000; 4.46 at 1,200). Bonferroni's rather than the universal sqrt(2 log n) (4.99; 3.77),
    which keeps a noise entry with probability ~0.15-0.2 at these n: harmless under soft thresholding,
    not when what clears is kept whole."""
    return float(-ndtri(NOISE_KEPT / (2.0 * max(entries, 1))))


#: The unigram's empirical-Bayes prior lives on [0, EB_TOP noise stds]: a point mass at 0, EB_LOG points
#: log-spaced from EB_LOW stds to 1 std and EB_LINEAR points evenly spaced from 1 to EB_TOP stds; its
#: weights are fitted by EB_ITERATIONS EM steps (fixed: the estimate is a deterministic function of the
#: released values). Words observed above EB_KEEP stds keep their observation.
EB_LOW = 1e-3
EB_LOG = 48
EB_LINEAR = 80
EB_TOP = 20.0
EB_KEEP = 10.0
EB_ITERATIONS = 200


def _positive_grid() -> Array:
    """The prior's support above 0, in noise stds (EB_* above)."""
    out: Array = np.concatenate(
        [np.geomspace(EB_LOW, 1.0, EB_LOG, endpoint=False), np.linspace(1.0, EB_TOP, EB_LINEAR)]
    )
    return out


def posterior_means(values: Array, std: float, grid: Array) -> Array:
    """Empirical Bayes for values = truth + N(0, std^2) noise (std > 0, public): the values observed within
    EB_KEEP stds of 0 get their posterior mean under the prior on `grid` (in stds) that maximises their
    marginal likelihood (Kiefer and Wolfowitz's nonparametric maximum-likelihood prior, fitted by
    EB_ITERATIONS EM steps; Koenker and Mizera 2014); the others keep their value (nearly their posterior
    mean under any prior smooth at the noise's scale). Deterministic; the EM runs on the distinct values
    rounded to std / 16, weighted by their counts."""
    values = np.asarray(values, dtype=np.float64)
    out = values.copy()
    near = np.abs(values) < EB_KEEP * std
    if not near.any():
        return out
    support = std * grid
    step = std / 16.0
    keys, inverse, weights = np.unique(np.round(values[near] / step), return_inverse=True, return_counts=True)
    log_kernel = -0.5 * ((keys[:, None] * step - support[None, :]) / std) ** 2
    kernel = np.exp(log_kernel - log_kernel.max(axis=1, keepdims=True))
    prior = np.full(support.size, 1.0 / support.size)
    share = weights / weights.sum()
    for _ in range(EB_ITERATIONS):
        prior = prior * (kernel.T @ (share / np.maximum(kernel @ prior, 1e-300)))
    posterior = kernel * prior[None, :]
    means = (posterior @ support) / np.maximum(posterior.sum(axis=1), 1e-300)
    out[near] = means[inverse.reshape(-1)]
    return out


def unigram_estimate(u_bar: Array, std: float) -> Array:
    """The word distribution from the averaged unigram release u_bar (V; Gaussian noise of std `std` on
    every entry, public): each word's posterior mean of its true (non-negative) clipped count under the
    empirical-Bayes prior on [0, EB_TOP stds] fitted to all words (`posterior_means`), normalised. The
    noisy tail is pulled towards the prior's mean of words observed alike and every word gets a positive
    probability. Post-processing: it reads only u_bar and std. At std = 0, u_bar itself (floored at 1e-12
    of its largest entry)."""
    u_bar = np.asarray(u_bar, dtype=np.float64)
    floor = 1e-12 * max(float(np.abs(u_bar).max(initial=0.0)), 1.0)
    if std > 0 and math.isfinite(std):
        u_bar = posterior_means(u_bar, std, np.concatenate([[0.0], _positive_grid()]))
    p = np.maximum(u_bar, 0.0) + floor
    out: Array = p / p.sum()
    return out


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
    #: A public word-frequency prior p0 over the vocabulary (vips.models.lda.word_prior.public_prior), or
    #: None: with the unigram block the M-step's unigram then shrinks towards it (prior_unigram_estimate).
    word_prior: tuple[float, ...] | None = None
    #: Where word_prior came from ("wordfreq 3.1.1, en, large"), named in the posterior.
    word_prior_source: str | None = None
    #: f, the pull towards the corpus's word frequencies (module docstring); 0 is the paper's M-step. Callers
    #: that build the query pass default_smoothing(its doc_length), as a job does.
    smoothing: float = 0.0

    def __post_init__(self) -> None:
        if self.topics < 1:
            raise ValueError("topics must be >= 1")
        for label, value in (("alpha", self.alpha), ("eta", self.eta)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{label} must be a finite number > 0")
        if not (self.smoothing >= 0 and math.isfinite(self.smoothing)):
            raise ValueError("smoothing must be a finite number >= 0")

    @property
    def doc_topic_prior(self) -> float:
        return 1.0 / self.topics if self.alpha is None else float(self.alpha)

    @property
    def topic_word_prior(self) -> float:
        return 1.0 / self.topics if self.eta is None else float(self.eta)

    def _lambda(self, counts: Array) -> Array:
        """lambda_kv = eta + X_kv + (f / K) sum_j X_jv from topic counts X (module docstring)."""
        pull = (self.smoothing / counts.shape[0]) * counts.sum(axis=0, keepdims=True)
        out: Array = self.topic_word_prior + counts + pull
        return out

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
        lam = (1.0 - rho) * state.lam + rho * self._lambda(population * s)
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
        noisy = u_std > 0
        p_u = self._unigram(unigram_sum, unigram_weight, noisy)
        # A topic's token mass; its counts start from the mass floored at 3 noise stds of that sum (a topic
        # whose mass is noise is the unigram), the residual is taken against the mass itself.
        total = raw.sum(axis=1, keepdims=True)
        mass = np.maximum(total, 3.0 * math.sqrt(variance * words))
        residual = raw - total * p_u[None, :]
        threshold = math.sqrt(variance) * keep_threshold(topics * words)
        kept = np.where(np.abs(residual) > threshold, residual, 0.0)
        counts = np.maximum(mass * p_u[None, :] + kept, 0.0)
        lam = self._lambda(counts)
        return LdaState(lam, {"s": s, "u": u}, raw, variance, unigram_sum, unigram_weight, noisy)

    def _unigram(self, unigram_sum: Array, unigram_weight: float, noisy: bool) -> Array:
        """p_u from the inverse-variance sums of the u releases (module docstring): u_bar = sum / weight,
        its noise std sqrt(1 / weight) when `noisy` (the weights are 1 / std^2), else 0."""
        u_bar = unigram_sum / unigram_weight
        u_bar_std = math.sqrt(1.0 / unigram_weight) if noisy else 0.0
        if self.word_prior is not None and len(self.word_prior) == u_bar.size:
            from vips.models.lda.word_prior import prior_unigram_estimate  # scipy.optimize: only here

            return prior_unigram_estimate(u_bar, u_bar_std, np.asarray(self.word_prior, dtype=np.float64))
        return unigram_estimate(u_bar, u_bar_std)

    def private_unigram(self, state: LdaState) -> Array | None:
        """The private unigram p_u the last M-step used (V, sums to 1), from the state's u releases alone;
        None without the unigram block. Post-processing, as the M-step."""
        if state.unigram_sum is None:
            return None
        return self._unigram(state.unigram_sum, state.unigram_weight, state.unigram_noisy)

    def posterior(self, state: LdaState) -> dict[str, Any]:
        """Natural parameters E[log beta], the last released s, the variational lambda, and per topic its
        20 most probable word ids with their probabilities E[beta_kv] ("topics"; the vocabulary maps ids
        to words); "word_prior" names the public word frequencies the unigram shrank towards, if any;
        "private_unigram" (with the unigram block) is the private unigram p_u the last M-step used, the
        cheap model the topics fall back to (`vips evaluate` scores it beside them)."""
        probabilities = topic_word_probabilities(state.lam)
        tops = top_words(state.lam, 20)
        unigram = self.private_unigram(state)
        lam = state.lam.tolist()  # one list under both keys: vips.posterior writes its text once
        return {
            "natural_parameters": {"expected_log_beta": expected_log_beta(state.lam).tolist()},
            "sufficient_statistics": {k: v.tolist() for k, v in state.statistics.items()},
            "variational_parameters": {
                "lambda": lam,
                "alpha": self.doc_topic_prior,
                "eta": self.topic_word_prior,
                "smoothing": self.smoothing,
            },
            "lambda": lam,
            "topics": [
                {"word_ids": ids, "probabilities": [float(probabilities[k, v]) for v in ids]}
                for k, ids in enumerate(tops)
            ],
            **({"word_prior": self.word_prior_source} if self.word_prior is not None else {}),
            **({"private_unigram": unigram.tolist()} if unigram is not None else {}),
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
    return word_frequency_perplexity(frequency / frequency.sum(), test)


def word_frequency_perplexity(p: Array, test: Counts) -> float:
    """exp(-sum_dv n_dv log p_v / sum_dv n_dv): every token of `test` scored by word frequencies p
    (V, positive, summing to 1)."""
    held = sp.csr_array(test)
    log_p = np.log(np.asarray(p, dtype=np.float64))
    return math.exp(-float(np.dot(held.data, log_p[held.indices])) / float(held.data.sum()))
