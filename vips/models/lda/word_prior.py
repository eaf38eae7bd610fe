"""A public word-frequency prior for the unigram fallback (issue 36).

The vocabulary of a bag-of-words dataset is public (it is in the schema), and so is how often English
words are used in general. `public_prior` turns the vocabulary into p0, a distribution over it from the
`wordfreq` package's "large" English list (Speer et al.; code Apache-2.0, data CC-BY-SA 4.0), or None
when no prior applies (wordfreq not installed, or fewer than MIN_COVERAGE of the words found: token ids,
synthetic corpora, another language). Words it lacks get the smallest frequency found in the vocabulary.

`prior_unigram_estimate` is the M-step's unigram from the averaged noisy release y (y_v = c_v + N(0,
std^2), c_v >= 0 the clipped word counts) with p0 as a covariate: a log-normal regression prior
    log c_v ~ N(a + b x_v, omega^2),   x_v = log p0_v - mean_w log p0_w,
whose hyperparameters theta = (a, b, log omega) maximise the marginal likelihood of y (empirical Bayes,
`fit_prior`), then each word's posterior mean of c_v. b is a temperature on p0 (b = 0: p0 ignored), omega
how far the corpus strays from it, a the log count of a typical word: all read off the release, none
tuned on the data. Post-processing: it reads only y, std and p0.

In noise-std units (std = 1), a word observed below KEEP stds has the marginal density
    m_v = int N(y_v - c; 0, 1) LN(c; mu_v, omega^2) dc,   mu_v = a + b x_v,
computed by quadrature on a fixed grid of c (`_grid`); a word above KEEP stds has a likelihood much
narrower than the prior, so m_v is the prior's density at y_v. With r = log c - mu_v and the log prior
l(c) = -r^2 / (2 omega^2) - log omega - log c - log(2 pi) / 2, the gradient and Hessian of sum_v log m_v
are posterior moments (Louis 1982): in (mu_v, log omega), d log m_v = E[dl | y_v] = (E[r] / omega^2,
E[r^2] / omega^2 - 1) and d^2 log m_v = E[d^2 l | y_v] + Cov[dl | y_v], all from E[r^k | y_v], k <= 4.
Newton's method with step halving (`_newton`; a step is scaled as a whole, never clipped coordinate by
coordinate) finds theta in about ten likelihood evaluations from a regression of log y on x over the
words well above the noise (`_start`), 0.05-0.1 s at V = 5,000.
A nonparametric prior on log c_v - b x_v (Kiefer-Wolfowitz, as vips.models.lda.model.posterior_means) gave
the same perplexities on the Wikipedia corpus at every epsilon tried, so only this estimator is kept.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from vips.models.base import Array

#: Below this share of vocabulary words found in wordfreq, no prior (None).
MIN_COVERAGE = 0.5
#: The grid of true counts for words observed below KEEP stds (in noise stds): c = log(1 + e^u) for
#: POINTS values of u evenly spaced from c = LOW to c = TOP, so log-spaced below 1 std and about evenly
#: spaced above, with the trapezoid weights of u (dc = du / (1 + e^-u)). The integrands are smooth in u and
#: negligible at both ends, where the trapezoid rule is spectrally accurate: the marginal likelihood and the
#: posterior means agree with a 4,000-point grid to ~1e-5 relative on the Wikipedia corpus. Words above
#: KEEP stds use the prior's density at their observation and Tweedie's correction.
LOW = 1e-6
TOP = 30.0
POINTS = 160
KEEP = 10.0
#: Newton's method stops when a Newton step moves no coordinate of theta more than TOLERANCE or raises the
#: log likelihood (a sum over the words) by less than GAIN, after GRADIENT_STALLS gradient steps in a row
#: (taken where halving the Newton step never gains) that each gain less than GAIN, when HALVINGS halvings
#: of both steps do not raise it, or after ITERATIONS steps.
TOLERANCE = 1e-6
GAIN = 1e-6
GRADIENT_STALLS = 3
HALVINGS = 20
ITERATIONS = 50
#: theta stays in this box (a in noise stds): the typical word's count at least 20 grid points above LOW,
#: b from -3 to 3, omega from 0.25 to 5. Below omega = 0.25 the prior gets narrower in log c than the grid
#: resolves (its step there is ~0.28; the trapezoid's relative error is ~2 exp(-2 pi^2 omega^2 / step^2),
#: 2e-7 at 0.25) and the computed likelihood would rise without bound as omega -> 0. The box binds only on
#: degenerate releases (all words noise, where the likelihood keeps rising as every count goes to 0); fits
#: on the Wikipedia corpus sit far inside (a from -3 to 3, b from 0.2 to 0.6, omega from 0.7 to 1).
LOWER = (math.log(LOW) + 5.0, -3.0, math.log(0.25))
UPPER = (math.log(TOP), 3.0, math.log(5.0))
#: The starting regression uses the words observed above START stds (at least START_WORDS of them).
START = 3.0
START_WORDS = 10

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def _frequencies(vocabulary: Sequence[str], language: str, wordlist: str) -> Array | None:
    """wordfreq's frequency of each word (0 when it lacks the word), or None without wordfreq. Its list
    (~50 MB as a dict for English "large") is read for this call and not kept: wordfreq's own caches are
    cleared, so a worker does not hold it between jobs (reading it again takes ~0.2 s)."""
    try:
        from wordfreq import get_frequency_dict, get_frequency_list
    except ImportError:
        return None
    try:
        table = get_frequency_dict(language, wordlist)
        return np.array([table.get(str(word).lower(), 0.0) for word in vocabulary], dtype=np.float64)
    finally:
        get_frequency_dict.cache_clear()
        get_frequency_list.cache_clear()


def english_prior(vocabulary: Sequence[str]) -> tuple[tuple[float, ...], str] | None:
    """LDA's prior as the model holds it: p0 over `vocabulary` from wordfreq's English "large" list and
    the list's name for the posterior ("wordfreq 3.1.1 (en, large)"), or None when no prior applies."""
    p0 = public_prior(vocabulary, language="en", wordlist="large")
    if p0 is None:
        return None
    from importlib.metadata import version

    return tuple(float(p) for p in p0), f"wordfreq {version('wordfreq')} (en, large)"


def public_prior(vocabulary: Sequence[str], language: str = "en", wordlist: str = "large") -> Array | None:
    """p0 over `vocabulary` from wordfreq (module docstring), or None when no prior applies."""
    if not vocabulary:
        return None
    found = _frequencies(vocabulary, language, wordlist)
    if found is None:
        return None
    if (found > 0).mean() < MIN_COVERAGE:
        return None
    found[found <= 0] = found[found > 0].min()
    out: Array = found / found.sum()
    return out


def _grid() -> tuple[Array, Array]:
    """Grid points c (in stds) and their quadrature weights (POINTS above)."""
    u = np.linspace(math.log(math.expm1(LOW)), math.log(math.expm1(TOP)), POINTS)
    points: Array = np.log1p(np.exp(u))
    weights: Array = (u[1] - u[0]) / (1.0 + np.exp(-u))
    return points, weights


class _Marginal:
    """log marginal likelihood of y (unit noise std) under the log-normal regression prior, its gradient
    and Hessian in theta = (a, b, log omega), and the posterior means (module docstring)."""

    def __init__(self, y: Array, x: Array):
        self.y, self.x = y, x
        self.near = y < KEEP  # and the negative ones: their posterior sits at the grid's low end
        self.far = ~self.near
        points, widths = _grid()
        self.c = points
        self.log_c = np.log(points)
        # Powers of log c (centred at `shift` to keep the moments small) for E[r^k | y], k = 0..4.
        self.shift = float(self.log_c.mean())
        centred = self.log_c - self.shift
        self.powers = np.stack([centred**k for k in range(5)] + [points], axis=1)
        # The parts of log N(y - c) + log(width) - log c that do not depend on theta.
        yn = y[self.near]
        self.fixed = -0.5 * (yn[:, None] - points[None, :]) ** 2 + (np.log(widths) - self.log_c)[None, :]
        self.log_y = np.log(y[self.far])

    def moments(self, theta: Array) -> tuple[float, Array, Array, Array]:
        """sum_v log m_v, and per word mu_v and E[r^k | y_v] for k = 1..4 (columns), and the posterior
        means of c (near words; far words get Tweedie's correction in `means`)."""
        a, b, log_omega = (float(t) for t in theta)
        inv = math.exp(-2.0 * log_omega)  # 1 / omega^2
        mu = a + b * self.x
        mun = mu[self.near]
        # log prior = -(log c - mu)^2 / (2 omega^2) - ...: expanded, its c- and word-dependent parts.
        joint = (
            self.fixed + (-0.5 * inv * self.log_c**2)[None, :] + (inv * mun)[:, None] * self.log_c[None, :]
        )
        top = joint.max(axis=1)
        joint -= top[:, None]
        # Terms below e^-600 of a word's largest are nothing to its sums; floored there, exp never makes
        # subnormal numbers (slow on most CPUs).
        np.maximum(joint, -600.0, out=joint)
        np.exp(joint, out=joint)
        sums = joint @ self.powers
        total = sums[:, 0]
        raw = sums[:, 1:5] / total[:, None]  # E[(log c - shift)^k | y], k = 1..4
        near_means = sums[:, 5] / total
        per_word = np.log(total) + top - 0.5 * inv * mun**2 - log_omega - 2.0 * _HALF_LOG_2PI
        # E[r^k] with r = (log c - shift) - d, d = mu - shift: binomial expansion of the raw moments.
        d = (mun - self.shift)[:, None]
        m1, m2, m3, m4 = (raw[:, k : k + 1] for k in range(4))
        near_r = np.concatenate(
            [
                m1 - d,
                m2 - 2 * d * m1 + d**2,
                m3 - 3 * d * m2 + 3 * d**2 * m1 - d**3,
                m4 - 4 * d * m3 + 6 * d**2 * m2 - 4 * d**3 * m1 + d**4,
            ],
            axis=1,
        )
        rf = (self.log_y - mu[self.far])[:, None]
        r = np.empty((self.y.size, 4))
        r[self.near] = near_r
        r[self.far] = np.concatenate([rf, rf**2, rf**3, rf**4], axis=1)
        far = -0.5 * inv * rf[:, 0] ** 2 - self.log_y - log_omega - _HALF_LOG_2PI
        loglik = float(per_word.sum() + far.sum())
        return loglik, mu, r, near_means

    def derivatives(self, theta: Array) -> tuple[float, Array, Array]:
        """sum_v log m_v, its gradient and Hessian in theta (module docstring)."""
        loglik, _, r, _ = self.moments(theta)
        inv = math.exp(-2.0 * float(theta[2]))
        e1, e2, e3, e4 = r.T
        # Per word, in (mu, log omega): the score and the Hessian E[d^2 l] + Cov[dl].
        g_mu, g_s = inv * e1, inv * e2 - 1.0
        h_mm = -inv + inv**2 * (e2 - e1**2)
        h_ms = -2.0 * inv * e1 + inv**2 * (e3 - e1 * e2)
        h_ss = -2.0 * inv * e2 + inv**2 * (e4 - e2**2)
        x = self.x
        grad = np.array([g_mu.sum(), x @ g_mu, g_s.sum()])
        hess = np.array(
            [
                [h_mm.sum(), x @ h_mm, h_ms.sum()],
                [x @ h_mm, (x * x) @ h_mm, x @ h_ms],
                [h_ms.sum(), x @ h_ms, h_ss.sum()],
            ]
        )
        return loglik, grad, hess

    def means(self, theta: Array) -> Array:
        """Each word's posterior mean of c (Tweedie's E[c | y] = y + d/dy log p(y) above KEEP stds, with
        p the prior's density, floored at y / 2)."""
        _, mu, _, near_means = self.moments(theta)
        omega2 = math.exp(2.0 * float(theta[2]))
        out = self.y.copy()
        out[self.near] = near_means
        yf = self.y[self.far]
        tweedie = yf + (-1.0 - (self.log_y - mu[self.far]) / omega2) / yf
        out[self.far] = np.maximum(tweedie, 0.5 * yf)
        return out


def _start(y: Array, x: Array) -> Array:
    """theta to start Newton from (unit noise std): b and omega from the least-squares regression of log y
    on x over the words above START stds (b = 1, omega = 1 when there are too few; b = 0 when x is
    constant), a from the total: sum_v y_v = sum_v E[c_v] = sum_v exp(a + b x_v + omega^2 / 2)."""
    b, omega = (1.0 if np.ptp(x) > 0 else 0.0), 1.0
    strong = y > START
    if strong.sum() >= START_WORDS and np.ptp(x[strong]) > 0:
        slope, intercept = np.polyfit(x[strong], np.log(y[strong]), 1)
        b = float(slope)
        omega = max(float(np.std(np.log(y[strong]) - intercept - slope * x[strong])), 0.3)
    total = max(float(y.sum()), 1.0)
    a = math.log(total) - float(np.log(np.exp(b * x + 0.5 * omega**2).sum()))
    return np.array([a, b, math.log(omega)])


def _newton(model: _Marginal, theta: Array) -> Array:
    """Maximise model's log marginal likelihood from theta within the box LOWER..UPPER: Newton steps (on a
    Hessian made negative definite where it is not) in the coordinates not held at the box's edge, scaled
    (`_bounded`) and halved until the likelihood does not drop, and the gradient's direction where halving
    the Newton step never gains (stopping rules above). b stays fixed where x is constant (p0 uniform: b is
    not identified)."""
    lower, upper = np.array(LOWER), np.array(UPPER)
    theta = np.clip(theta, lower, upper)
    identified = np.array([True, bool(np.ptp(model.x) > 0), True])
    loglik, grad, hess = model.derivatives(theta)
    stalls = 0  # gradient steps in a row that gained less than GAIN
    for _ in range(ITERATIONS):
        # Coordinates on the box's edge with the gradient pointing out stay there for this step.
        free = identified & ~(((theta <= lower) & (grad < 0)) | ((theta >= upper) & (grad > 0)))
        if not free.any():
            break
        g, h = grad[free], hess[np.ix_(free, free)]
        values, vectors = np.linalg.eigh(h)
        # Directions of non-negative curvature get their curvature's sign flipped (or a tiny curvature).
        values = -np.maximum(np.abs(values), max(1e-8 * float(np.abs(values).max()), 1e-12))
        newton = np.zeros(3)
        newton[free] = -(vectors @ ((vectors.T @ g) / values))
        gradient = np.where(free, grad, 0.0)
        for direction in (newton, gradient):
            step = _bounded(theta, direction, lower, upper)
            for _ in range(HALVINGS):
                trial = theta + step
                new_loglik, new_grad, new_hess = model.derivatives(trial)
                if new_loglik >= loglik:
                    break
                step = 0.5 * step
            else:
                continue
            break
        else:
            return theta
        gain = new_loglik - loglik
        theta, loglik, grad, hess = trial, new_loglik, new_grad, new_hess
        # One gradient step's small gain says little about convergence (the next Newton step may gain more);
        # several in a row do.
        if direction is newton:
            if np.abs(step).max() < TOLERANCE or gain < GAIN:
                break
            stalls = 0
        else:
            stalls = stalls + 1 if gain < GAIN else 0
            if stalls >= GRADIENT_STALLS:
                break
    return theta


def _bounded(theta: Array, direction: Array, lower: Array, upper: Array) -> Array:
    """The step along `direction` scaled as a whole to move no coordinate of theta more than 1 (at most
    e-fold changes of omega and of the typical count), then projected on the box. Scaling keeps an ascent
    direction one; clipping each coordinate on its own, as before, could turn it into a descent direction
    where the Hessian is nearly singular, and Newton's method then stopped at its starting point (a
    private unigram 70% worse than usual in 6 of 150 releases on a small corpus at epsilon 1)."""
    largest = float(np.abs(direction).max())
    step = direction / max(largest, 1.0)
    out: Array = np.clip(theta + step, lower, upper) - theta
    return out


def fit_prior(y: Array, std: float, p0: Array) -> tuple[Array, dict[str, float]]:
    """Posterior means of the true counts under the empirical-Bayes log-normal regression prior (module
    docstring) and the fitted hyperparameters a, b, omega (a in the units of y), for y = c + N(0, std^2)
    with std > 0 and p0 > 0 (as public_prior's)."""
    scaled = np.asarray(y, dtype=np.float64) / std
    x = np.log(np.asarray(p0, dtype=np.float64))
    x = x - x.mean()  # centred: a is the log count of a typical word
    model = _Marginal(scaled, x)
    theta = _newton(model, _start(scaled, x))
    means = model.means(theta) * std
    return means, {"a": float(theta[0]) + math.log(std), "b": float(theta[1]), "omega": math.exp(theta[2])}


def prior_unigram_estimate(u_bar: Array, std: float, p0: Array) -> Array:
    """The unigram from the averaged release u_bar (noise std `std`, public) and the public prior p0:
    posterior means under the empirical-Bayes prior (module docstring), floored at 1e-12 and normalised.
    At std = 0, u_bar itself (floored as vips.models.lda.model.unigram_estimate)."""
    u_bar = np.asarray(u_bar, dtype=np.float64)
    if not (std > 0 and math.isfinite(std)):
        floor = 1e-12 * max(float(np.abs(u_bar).max(initial=0.0)), 1.0)
        p = np.maximum(u_bar, 0.0) + floor
        plain: Array = p / p.sum()
        return plain
    means, _ = fit_prior(u_bar, std, p0)
    p = np.maximum(means / std, 1e-12)  # floored in noise stds
    out: Array = p / p.sum()
    return out
