"""Empirical privacy audit through the real gate (docs/design.md section 7): worst-case canary pairs
released many times, and statistical lower bounds on the privacy they lose, against what the ledger charges.

For each query, two neighbouring datasets D and D' (S = N, so no sampling: one release is one Gaussian
mechanism with noise multiplier sigma) differ in one record, chosen from the query contract's
`adversarial_records` (the records that push each block to its declared bound) to move the released
statistic as far as possible. Each release is whitened by the per-block noise std the gate reports
(`Release.noise_std`) and projected on the direction of the exact mean difference, so it becomes a scalar
~ N(0, 1) under D and N(m, 1) under D', where m is the canary's exact whitened shift.

What the declaration guarantees: block b gets noise sigma J Delta_b per coordinate, J the joint sensitivity
of the normalised blocks (sqrt(B) by default, or the query's proven smaller bound); the whitened shift is
||((mu'_b - mu_b) / (sigma J Delta_b))_b|| <= J / (J sigma) = 1 / sigma for every neighbouring pair. So one
release is mu-Gaussian-DP (Dong, Roth, Su 2022) with mu = 1 / sigma, whatever J the query declares, and
the scalar pair above is a post-processing of it: no canary may show a shift above 1 / sigma.

The audits are one-sided at significance level ALPHA = 1e-3: a correct mechanism fails each with
probability <= 1e-3 over the noise (with the fixed seeds below the suite is deterministic, so a correct
implementation would fail with another seed about once in 1,000 seeds):

- Gaussian DP: a one-sided lower confidence bound on the standardised mean difference of the scalars under
  D' and D (exact under the Gaussian model: the noncentral t) must not exceed 1 / sigma. Standardising by
  the empirical (pooled) std, not the declared one, means a gate that adds less noise than it reports is
  caught too. The point estimate is never tested: a tight mechanism lands above its exact value half the
  time.
- Clopper-Pearson epsilon (BLR and LDA): a threshold test on the scalar, its false-positive and
  false-negative rates bounded by Clopper-Pearson at ALPHA / 2 each, gives a lower bound on epsilon at
  delta = CP_DELTA that must not exceed what the ledger's accountant charges for one release at that delta
  (`privacy_wall.accounting.calibration.epsilon`); it must also reach a fair fraction of the exact epsilon
  (power).
- Both audits detect a deliberately broken mechanism: the same gate with half the noise it reports
  (`discrete_gaussian_noise` patched), whose Gaussian-DP lower bound must exceed 1 / sigma and whose
  epsilon lower bound must exceed the exact epsilon of the declared mechanism. These are the power checks:
  the expected margins, from the Gaussian model, are stated at each test.

Stores are public and the gates seeded (private data refuses seeds): public and private releases run the same
code apart from where the generator comes from. The last two sections audit subsampled releases (S < N)
against the `pld` accountant's price (a job's own price; the budget's filter, which charges more, is audited
under full adaptivity in tests/privacy_wall/accounting/test_filter.py): single releases on a private store,
with the private generator and sampler; and a job of T = 10 releases at q = 1/4, its transcripts simulated
from their exact distribution, against what the real gate's ledger charges for them, where a price 0.6 x the
real one (which the single-release audits let pass) is shown to fail the audit.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from itertools import combinations
from unittest import mock

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import optimize, stats

import privacy_wall.accounting.pld as pld
import privacy_wall.noise.mechanisms as mechanisms
import tests.privacy_wall.queries.test_blr as blr_tests
import tests.privacy_wall.queries.test_dpsep as dpsep_tests
import tests.privacy_wall.queries.test_dpvi as dpvi_tests
import tests.privacy_wall.queries.test_lda as lda_tests
import tests.privacy_wall.queries.test_linreg as linreg_tests
import tests.privacy_wall.queries.test_sbn as sbn_tests
from privacy_wall.accounting.accountants import PldAccountant, PrivacyCost, clear_caches, get_accountant
from privacy_wall.accounting.calibration import epsilon
from privacy_wall.accounting.events import SubsampledGaussianEvent
from privacy_wall.data.store import Batch
from privacy_wall.gate import Gate
from privacy_wall.ledger.base import InMemoryLedger
from privacy_wall.noise.discrete_gaussian import DENOMINATOR_MAX
from privacy_wall.queries.base import Array
from tests.contracts import Params, QueryContract

# The contracts' extreme public parameters overflow on purpose while the canaries are searched.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

#: Significance level of every one-sided bound below.
ALPHA = 1e-3
#: Noise multiplier of every audited release: declared Gaussian-DP mu = 1 / SIGMA.
SIGMA = 1.0
#: Releases per dataset for the Gaussian-DP audit: the bound's margin is about z_{1-ALPHA} sqrt(2 / n)
#: = 3.09 * 0.032 = 0.10 in units of the noise std.
GDP_RELEASES = 2000
#: Releases per dataset for the Gaussian-DP detection of halved noise (the shift to detect is large).
GDP_BROKEN_RELEASES = 1000
#: Releases per dataset for the Clopper-Pearson audit: the first CP_SELECTION choose the threshold, the
#: rest (independent of that choice) bound the error rates.
CP_RELEASES = 4000
CP_SELECTION = 1000
#: delta of the Clopper-Pearson audit. A threshold test on n releases cannot certify false-positive rates
#: below ~log(1 / ALPHA) / n, so it can only show epsilons up to ~log(n): at delta = 1e-5 the exact
#: epsilon of one release at sigma = 1 is 4.4 and nothing measured from thousands of releases comes near
#: it. At delta = 1e-2 the ledger charges 2.32, which 3,000 releases can reach about half of.
CP_DELTA = 1e-2
#: Power: the Clopper-Pearson lower bound must reach this fraction of the declared mechanism's exact
#: epsilon. Expected (Gaussian model, 3,000 evaluation releases): ~0.45-0.55 of it for shifts of 0.88-1.0;
#: the bound's own spread is ~0.1 in epsilon.
CP_MIN_FRACTION = 0.25
#: Every canary must shift the whitened statistic by at least this fraction of 1 / SIGMA: then halving the
#: noise doubles the shift to >= 1.2 / SIGMA, which the Gaussian-DP bound (margin <= 0.15 at 1,000
#: releases) separates from 1 / SIGMA.
MIN_CANARY_REACH = 0.6
#: Relative slack on the exact (pre-noise) shift: rounding of sums of S values (contracts.py).
SHIFT_SLACK = 1e-9


def blr_joint_pair() -> tuple[Batch, ...]:
    """docs/design.md section 2: unit rows at cosine 1/4 with opposite labels and both Polya-Gamma means at
    1/4 (second moment 0) reach BLR's joint sensitivity 1.25 of the normalised blocks."""
    other = np.array([0.25, math.sqrt(15.0) / 4.0, 0.0])
    return (blr_tests.record(np.eye(3)[0], 1.0), blr_tests.record(other, 0.0))


@dataclass(frozen=True)
class AuditCase:
    contract: QueryContract
    #: N = S: large enough that each contract's check_postprocess_inactive holds (PSD projection or
    #: clamping never fires, so releases are exactly Gaussian), small enough to be quick. N does not
    #: change the whitened shift: both the record's effect and the noise scale as 1 / N.
    population: int
    extra_records: tuple[Batch, ...] = ()


CASES: dict[str, AuditCase] = {
    "blr": AuditCase(blr_tests.TestBlrQuery(), 1000, blr_joint_pair()),
    "linreg": AuditCase(linreg_tests.TestLinregQuery(), 1000),
    "dpvi": AuditCase(dpvi_tests.TestDpviQuery(), 1000),
    "dpsep-logistic": AuditCase(dpsep_tests.TestDpSepLogisticQuery(), 1000),
    "dpsep-linear": AuditCase(dpsep_tests.TestDpSepLinearQuery(), 1000),
    "dpsep-normal-gamma": AuditCase(dpsep_tests.TestDpSepNormalGammaQuery(), 1000),
    "lda": AuditCase(lda_tests.TestLdaQuery(), 300),
    "sbn": AuditCase(sbn_tests.TestSbnQuery(), 100),
}
SEEDS = {name: 7000 + 10 * i for i, name in enumerate(CASES)}


@dataclass(frozen=True)
class Canary:
    """A worst-case neighbouring pair and the projection that turns a release into one scalar."""

    params: Params
    neighbours: tuple[Batch, Batch]
    noise_std: dict[str, float]
    #: Per block: the unit direction of the whitened mean difference, divided once more by the block's std,
    #: so that sum_b <weights_b, release_b> is the whitened release projected on that direction.
    weights: dict[str, Array]
    #: The projection of D's exact means (subtracted, so D's scalars have mean 0).
    offset: float
    #: The exact whitened shift ||(mu'_b - mu_b) / std_b||: the mean of D''s scalars.
    shift: float


def whitened_distance(a: dict[str, Array], b: dict[str, Array], scale: dict[str, float]) -> float:
    return math.sqrt(sum(float(np.sum(((a[k] - b[k]) / scale[k]) ** 2)) for k in scale))


@cache
def canary(name: str) -> Canary:
    """Search the contract's parameter sets and adversarial record pairs for the largest whitened shift at
    which post-processing stays inactive on both datasets."""
    case = CASES[name]
    contract = case.contract
    contract.calibration_population = case.population  # an instance attribute: the class is untouched
    query = contract.make_query()
    rng = np.random.default_rng(SEEDS[name])
    base = contract.calibration_rows(rng)
    pilot = Gate(contract.make_store("pilot", base, public=True), InMemoryLedger(delta=CP_DELTA), seed=0)
    noise_std = pilot.release(
        query, contract.calibration_params(), job_id="pilot", iteration=1, sigma=SIGMA, batch_size=base.size
    ).noise_std
    # The whitened effect of one record at batch size N: its contribution / (N std_b).
    scale = {block: std * base.size for block, std in noise_std.items()}
    best: Canary | None = None
    for params in [contract.calibration_params(), *contract.make_params(rng)]:
        records = [*contract.adversarial_records(params), *case.extra_records]
        effects = [contract._means(query, record, params) for record in records]  # one-row batch: its sum
        pairs = sorted(
            combinations(range(len(records)), 2),
            key=lambda pair: whitened_distance(effects[pair[0]], effects[pair[1]], scale),
        )
        i, j = pairs[-1]
        if best is not None and whitened_distance(effects[i], effects[j], scale) <= best.shift * (1 + 1e-6):
            continue  # not better (ties keep the earlier, more ordinary parameters)
        neighbours = (
            contract.replace_record(base, 0, records[i]),
            contract.replace_record(base, 0, records[j]),
        )
        exact = [contract._means(query, rows, params) for rows in neighbours]
        try:
            for means in exact:
                contract.check_postprocess_inactive(means, noise_std)
        except (AssertionError, np.linalg.LinAlgError):
            continue  # e.g. a singular second moment that a release would project: not exactly Gaussian
        shift = whitened_distance(exact[1], exact[0], noise_std)
        weights = {k: (exact[1][k] - exact[0][k]) / noise_std[k] ** 2 / shift for k in noise_std}
        offset = sum(float(weights[k] @ exact[0][k]) for k in noise_std)
        best = Canary(params, neighbours, noise_std, weights, offset, shift)
    assert best is not None, f"{name}: no canary pair keeps post-processing inactive"
    return best


REAL_NOISE = mechanisms.discrete_gaussian_noise


def half_noise(sigma2: Fraction, size: int, rng: np.random.Generator) -> NDArray[np.int64]:
    """A broken mechanism: half the noise it reports (release_blocks still reports the full scale)."""
    quarter = Fraction(math.ceil(sigma2 * DENOMINATOR_MAX / 4), DENOMINATOR_MAX)
    return REAL_NOISE(quarter, size, rng)


@contextmanager
def noise(broken: bool) -> Iterator[None]:
    if not broken:
        yield
        return
    with mock.patch.object(mechanisms, "discrete_gaussian_noise", half_noise):
        yield


@cache
def scalars(name: str, which: int, releases: int, broken: bool = False) -> Array:
    """`releases` releases of dataset `which` (0: D, 1: D') through a seeded gate on a public store, each
    whitened and projected: ~N(0, 1) under D and N(shift, 1) under D' for the declared mechanism."""
    case, found = CASES[name], canary(name)
    contract = case.contract
    query = contract.make_query()
    rows = found.neighbours[which]
    seed = SEEDS[name] + 2 * which + (1 if broken else 0) + 1000 * releases
    gate = Gate(
        contract.make_store(f"canary-{which}", rows, public=True), InMemoryLedger(delta=CP_DELTA), seed=seed
    )
    out = np.empty(releases)
    with noise(broken):
        for t in range(releases):
            release = gate.release(
                query, found.params, job_id="audit", iteration=t + 1, sigma=SIGMA, batch_size=rows.size
            )
            assert release.noise_std == pytest.approx(found.noise_std, rel=1e-12)
            blocks = contract.released_blocks(release.statistics)
            out[t] = sum(float(found.weights[k] @ blocks[k]) for k in found.weights) - found.offset
    return out


# --------------------------------------------------------------------------------------------------------
# Statistics.


def gdp_mu_lower_bound(under_d: Array, under_d_prime: Array, alpha: float) -> float:
    """One-sided (1 - alpha) lower confidence bound on mu = (E Y - E X) / s from X_i ~ N(m, s^2) and
    Y_i ~ N(m + mu s, s^2), all independent (s unknown, estimated by the pooled std).

    T = (mean Y - mean X) / (s_pooled sqrt(1/n1 + 1/n2)) has the noncentral t distribution with n1 + n2 - 2
    degrees of freedom and noncentrality mu / sqrt(1/n1 + 1/n2) (exact for Gaussian samples). The bound is
    the noncentrality at which the observed T is the upper alpha quantile: P(T >= t_obs) = alpha.
    """
    n1, n2 = under_d.size, under_d_prime.size
    df = n1 + n2 - 2
    pooled = math.sqrt(((n1 - 1) * np.var(under_d, ddof=1) + (n2 - 1) * np.var(under_d_prime, ddof=1)) / df)
    spread = math.sqrt(1 / n1 + 1 / n2)
    t = float(np.mean(under_d_prime) - np.mean(under_d)) / (pooled * spread)

    def excess(noncentrality: float) -> float:
        return float(stats.nct.sf(t, df, noncentrality)) - alpha

    low = t - 10.0 - abs(t)  # sf(t; low) ~ 0 < alpha; sf(t; t) ~ 1/2 > alpha
    return float(optimize.brentq(excess, low, t, xtol=1e-10)) * spread


def clopper_pearson_upper(failures: int, trials: int, alpha: float) -> float:
    """One-sided (1 - alpha) Clopper-Pearson upper bound on a binomial proportion."""
    return 1.0 if failures >= trials else float(stats.beta.ppf(1 - alpha, failures + 1, trials - failures))


def epsilon_lower_bound(
    under_d: Array, under_d_prime: Array, threshold: float, delta: float, alpha: float
) -> float:
    """Lower bound on epsilon at delta from the test "D' if scalar > threshold", at confidence 1 - alpha.

    (epsilon, delta)-DP gives, for the rejection region R and its complement, P_D'(R) <= e^eps P_D(R) + delta
    and P_D(R^c) <= e^eps P_D'(R^c) + delta: eps >= log((1 - delta - FNR) / FPR) and
    eps >= log((1 - delta - FPR) / FNR). FPR and FNR are replaced by Clopper-Pearson upper bounds at
    alpha / 2 each, so both hold at once with probability >= 1 - alpha and the larger bound is valid.
    """
    fpr = clopper_pearson_upper(int(np.sum(under_d > threshold)), under_d.size, alpha / 2)
    fnr = clopper_pearson_upper(int(np.sum(under_d_prime <= threshold)), under_d_prime.size, alpha / 2)
    bounds = [
        math.log((1 - delta - false_neg) / false_pos) if 1 - delta - false_neg > 0 else -math.inf
        for false_pos, false_neg in ((fpr, fnr), (fnr, fpr))
    ]
    return max(bounds)


def gaussian_dp_epsilon(mu: float, delta: float) -> float:
    """The exact epsilon at delta of a mu-GDP mechanism (one Gaussian release with sensitivity / std = mu):
    delta(eps) = Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2) (Balle and Wang 2018, Thm 8;
    Dong, Roth, Su 2022, Cor. 2.13), decreasing in eps. Written out here, independently of the accountant."""

    def excess(eps: float) -> float:
        tail = math.exp(eps + float(stats.norm.logcdf(-eps / mu - mu / 2)))
        return float(stats.norm.cdf(-eps / mu + mu / 2)) - tail - delta

    hi = 200.0
    while excess(hi) > 0:  # mu so large the answer is above 200
        hi *= 2.0
    return float(optimize.brentq(excess, 0.0, hi, xtol=1e-12))


def clopper_pearson_epsilon(name: str, broken: bool = False) -> float:
    """The epsilon lower bound at CP_DELTA from the canary's releases. The threshold is the selection
    releases' best; the bound uses only the other releases, so the choice does not bias it."""
    return selected_threshold_bound(
        scalars(name, 0, CP_RELEASES, broken),
        scalars(name, 1, CP_RELEASES, broken),
        np.linspace(0.01, 0.99, 99),
    )


def selected_threshold_bound(under_d: Array, under_d_prime: Array, quantiles: Array) -> float:
    """The epsilon lower bound at CP_DELTA of the threshold (among the pooled selection releases' quantiles)
    that the first CP_SELECTION releases make best, computed on the other releases only."""
    pick_d, pick_d_prime = under_d[:CP_SELECTION], under_d_prime[:CP_SELECTION]
    candidates = np.quantile(np.concatenate([pick_d, pick_d_prime]), quantiles)
    threshold = max(
        candidates, key=lambda t: epsilon_lower_bound(pick_d, pick_d_prime, float(t), CP_DELTA, ALPHA)
    )
    return epsilon_lower_bound(
        under_d[CP_SELECTION:], under_d_prime[CP_SELECTION:], float(threshold), CP_DELTA, ALPHA
    )


# --------------------------------------------------------------------------------------------------------
# The audits.


@pytest.mark.parametrize("name", list(CASES))
def test_canary_shift_is_within_the_declaration_and_strong(name: str) -> None:
    """The exact (noise-free) whitened shift of the canary pair is within the declared 1 / sigma, and
    strong enough for the audits below to have power."""
    found = canary(name)
    assert found.shift <= (1 + SHIFT_SLACK) / SIGMA, f"{name}: exact shift {found.shift:.6f} x sigma > 1"
    assert found.shift >= MIN_CANARY_REACH / SIGMA, f"{name}: canary reaches only {found.shift * SIGMA:.3f}"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_gaussian_dp_audit(name: str) -> None:
    """The lower confidence bound on the empirical Gaussian-DP mu does not exceed the declared 1 / sigma."""
    lower = gdp_mu_lower_bound(scalars(name, 0, GDP_RELEASES), scalars(name, 1, GDP_RELEASES), ALPHA)
    assert lower <= 1 / SIGMA, f"{name}: mu >= {lower:.3f} at confidence 1 - {ALPHA:g}, declared {1 / SIGMA}"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_gaussian_dp_audit_detects_halved_noise(name: str) -> None:
    """With half the reported noise the canary's true mu is 2 x its shift >= 1.2 / sigma: the same audit
    must reject (this is what makes the test above worth passing)."""
    under_d = scalars(name, 0, GDP_BROKEN_RELEASES, broken=True)
    under_d_prime = scalars(name, 1, GDP_BROKEN_RELEASES, broken=True)
    # The broken mechanism is really in use: the whitened scalars' std is ~1/2, not 1 (chi-square at
    # 1,000 values: +-8% at this level).
    assert np.std(under_d, ddof=1) < 0.6
    assert gdp_mu_lower_bound(under_d, under_d_prime, ALPHA) > 1 / SIGMA


@pytest.mark.slow
@pytest.mark.parametrize("name", ["blr", "lda"])
def test_clopper_pearson_epsilon_audit(name: str) -> None:
    """The epsilon lower bound does not exceed what the ledger charges for one release at CP_DELTA, and
    reaches a fair fraction of the exact epsilon of the declared mechanism (2.32 at sigma = 1)."""
    population = CASES[name].population
    charged = epsilon(SIGMA, population, population, 1, CP_DELTA, PldAccountant.name)
    exact = gaussian_dp_epsilon(1 / SIGMA, CP_DELTA)
    # S = N: the release is exactly one Gaussian mechanism, so no correct accountant charges less.
    assert charged >= exact * (1 - 1e-6), (charged, exact)
    lower = clopper_pearson_epsilon(name)
    assert lower <= charged, (
        f"{name}: epsilon >= {lower:.3f} at confidence 1 - {ALPHA:g}, charged {charged:.3f}"
    )
    assert lower >= CP_MIN_FRACTION * exact, f"{name}: the audit has no power ({lower:.3f} vs {exact:.3f})"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["blr", "lda"])
def test_clopper_pearson_audit_detects_halved_noise(name: str) -> None:
    """Half the noise: the canary's true mu is 2 x its shift (>= 1.77 for shifts >= 0.88), and the
    bound (expected ~2.8-3.2 from 3,000 releases) exceeds the exact epsilon 2.32 of the declared mechanism.
    Compared with the exact value rather than the ledger's, which may use a looser accountant (RDP charges
    2.75 here): the audit must see through the mechanism, whatever the accountant adds on top."""
    exact = gaussian_dp_epsilon(1 / SIGMA, CP_DELTA)
    lower = clopper_pearson_epsilon(name, broken=True)
    assert lower > exact, f"{name}: halved noise not detected ({lower:.3f} vs {exact:.3f})"


# --------------------------------------------------------------------------------------------------------
# Subsampled releases (S < N), through the real private generator and sampler.
#
# D holds N copies of one record and D' replaces one of them by another, so a batch under D is S copies
# (the statistic does not move with the sample) and under D' it holds the other record with probability
# q = S / N: the whitened scalar is N(0, 1) under D and (1 - q) N(0, 1) + q N(shift, 1) under D', the
# mixture pair of C_q(G_{1/sigma}) that the `pld` accountant prices. DPVI's release has no post-processing
# (check_postprocess_inactive holds for any input), so the scalar is exactly that. The store is private: no
# seed reaches the gate, so batches and noise come from the OS-seeded generator and the audit is random
# (it fails with probability <= ALPHA for a correct mechanism).

SUBSAMPLED_POPULATION = 200
SUBSAMPLED_BATCH = 100
#: Power: the bound must reach this fraction of the charged epsilon (1.45), i.e. the audit is not vacuous
#: (test_subsampled_audit_detects_halved_noise shows what it detects). Measured over 20 runs of the audit
#: (shift 1.00): 0.36-0.83, mean 0.61, sd 0.12 (0.25-0.57 of the price); one run in a full suite gave
#: 0.232, under the 0.2 this was (0.29): a threshold picked on the selection releases that did poorly on the
#: others. Halved noise: 2.1-2.65.
SUBSAMPLED_MIN_FRACTION = 0.1


@dataclass(frozen=True)
class SubsampledCanary:
    neighbours: tuple[Batch, Batch]
    params: Params
    weights: dict[str, Array]
    offset: float
    shift: float  # the whitened shift when the replaced record is in the batch


@cache
def subsampled_canary() -> SubsampledCanary:
    contract = dpvi_tests.TestDpviQuery()
    query = contract.make_query()
    params = contract.calibration_params()
    records = contract.adversarial_records(params)
    rng = np.random.default_rng(SEEDS["dpvi"])
    pilot_rows = contract.make_batch(rng, SUBSAMPLED_POPULATION)
    pilot = Gate(
        contract.make_store("pilot", pilot_rows, public=True), InMemoryLedger(delta=CP_DELTA), seed=0
    )
    noise_std = pilot.release(
        query, params, job_id="pilot", iteration=1, sigma=SIGMA, batch_size=SUBSAMPLED_BATCH
    ).noise_std
    effects = [contract._means(query, record, params) for record in records]  # one record's clipped sum
    scale = {block: std * SUBSAMPLED_BATCH for block, std in noise_std.items()}
    i, j = max(
        combinations(range(len(records)), 2),
        key=lambda pair: whitened_distance(effects[pair[0]], effects[pair[1]], scale),
    )
    base = records[i]
    for _ in range(SUBSAMPLED_POPULATION - 1):
        base = Batch(
            np.vstack([base.features, records[i].features]), np.concatenate([base.labels, records[i].labels])
        )
    other = contract.replace_record(base, 0, records[j])
    shift = whitened_distance(effects[j], effects[i], scale)
    weights = {
        k: (effects[j][k] - effects[i][k]) / SUBSAMPLED_BATCH / noise_std[k] ** 2 / shift for k in noise_std
    }
    offset = sum(float(weights[k] @ effects[i][k]) for k in noise_std)  # D's batch mean is record i's
    return SubsampledCanary((base, other), params, weights, offset, shift)


def subsampled_scalars(which: int, releases: int, broken: bool = False) -> Array:
    """Releases of dataset `which` on a private store: S of N rows sampled and noised by the private
    generator, whitened and projected like `scalars`."""
    contract, found = dpvi_tests.TestDpviQuery(), subsampled_canary()
    query = contract.make_query()
    store = contract.make_store(f"private-{which}", found.neighbours[which], public=False)
    gate = Gate(store, InMemoryLedger(delta=CP_DELTA))
    out = np.empty(releases)
    with noise(broken):
        for t in range(releases):
            release = gate.release(
                query, found.params, job_id="audit", iteration=t + 1, sigma=SIGMA, batch_size=SUBSAMPLED_BATCH
            )
            out[t] = (
                sum(float(found.weights[k] @ release.statistics[k]) for k in found.weights) - found.offset
            )
    return out


def subsampled_epsilon_bound(broken: bool = False) -> float:
    """The threshold is searched in the upper half: D' differs from D only in its upper tail; not above
    its 97th percentile, where a threshold has ~30 of the 1,000 selection releases above it and can win the
    selection by chance, leaving a held-out bound near 0 (seen once: 0.029; picks measured 0.81-0.94)."""
    return selected_threshold_bound(
        subsampled_scalars(0, CP_RELEASES, broken),
        subsampled_scalars(1, CP_RELEASES, broken),
        np.linspace(0.5, 0.97, 100),
    )


def test_subsampled_canary_is_within_the_declaration() -> None:
    found = subsampled_canary()
    assert MIN_CANARY_REACH / SIGMA <= found.shift <= (1 + SHIFT_SLACK) / SIGMA


@pytest.mark.slow
def test_clopper_pearson_epsilon_audit_of_subsampled_releases() -> None:
    """S = 100 of N = 200 on a private store: the epsilon lower bound stays below what the `pld` ledger
    charges for one subsampled release at CP_DELTA (1.45), and reaches a fair fraction of it."""
    charged = epsilon(SIGMA, SUBSAMPLED_BATCH, SUBSAMPLED_POPULATION, 1, CP_DELTA, PldAccountant.name)
    lower = subsampled_epsilon_bound()
    assert lower <= charged, f"epsilon >= {lower:.3f} at confidence 1 - {ALPHA:g}, charged {charged:.3f}"
    assert lower >= SUBSAMPLED_MIN_FRACTION * charged, f"no power ({lower:.3f} vs {charged:.3f})"


@pytest.mark.slow
def test_subsampled_audit_detects_halved_noise() -> None:
    """Half the noise: the pair becomes C_q(G_{2 shift}) (exact epsilon 4.7 at shift 1); the bound
    (measured 2.1-2.65) exceeds the 1.45 the declared mechanism is charged."""
    charged = epsilon(SIGMA, SUBSAMPLED_BATCH, SUBSAMPLED_POPULATION, 1, CP_DELTA, PldAccountant.name)
    assert subsampled_epsilon_bound(broken=True) > charged


# --------------------------------------------------------------------------------------------------------
# Composed subsampled releases (issue 34, item 5): T releases of S of N, against the ledger's real price.
#
# The audits above release once per dataset, where the price of a subsampled release is small and its
# lower bound loose: a price 40% too low went unnoticed. Here one job makes T = 10 releases at q = S / N =
# 1/4, sigma = 1, and the ledger's delta is CP_DELTA. The ledger charges 2.760 (`pld`; `rdp` would charge
# 6.14, and the releases priced as if on the whole dataset 11.61: the price rests on the subsampled
# analysis), and the pair below reaches 2.571 of it (exactly, up to +-0.003: Monte Carlo over 4 x 10^6
# transcripts of delta(eps) = E_D'[(1 - e^(eps - L))_+]).
#
# The pair: D holds N copies of one record and D' replaces one of them by a record that moves the whitened
# release by the full 1 / sigma along the canary direction (the DPVI canary of the section above reaches
# 0.99998 of it). Each release samples exactly S of N afresh (D''s record is in it with probability q) and
# draws fresh noise, so a job's T projected releases (here with fixed parameters: a special case of
# adaptive composition) are i.i.d. N(0, 1) under D and i.i.d. (1 - q) N(0, 1) + q N(1 / sigma, 1) under
# D': the T-fold composition of one of the two ordered pairs whose larger profile is C_q's, which the
# `pld` accountant composes, so no correct price is below this pair's epsilon.
# 300,000 transcripts of T releases per dataset would be 6 million gate releases, so the transcripts are
# simulated from that exact distribution (the real gate's single releases, through the private sampler
# and generator, are audited against it above); the price is the real one: the T releases are made by the
# real gate on a private store of N rows, and the audit reads what its ledger then reports spent.

COMPOSED_POPULATION = 200
COMPOSED_BATCH = 50
COMPOSED_RELEASES = 10
#: Simulated transcripts per dataset: the pilot ones choose the threshold, the audit ones (another stream,
#: independent of that choice) bound the error rates.
COMPOSED_PILOT = 50_000
COMPOSED_TRANSCRIPTS = 300_000
COMPOSED_SEED = 9100
#: Power: the bound must reach this fraction of the price (measured: 0.84 of it on average, sd 0.018,
#: lowest 0.81 over 20 seeds; see `composed_epsilon_bound`). Any price below it fails the audit.
COMPOSED_MIN_FRACTION = 0.7
#: The mutation the audit must catch: the subsampled price 40% too low.
UNDERPRICING = 0.6


def composed_losses(which: int, transcripts: int, stream: int, seed: int = COMPOSED_SEED) -> Array:
    """The privacy loss L = log(p_D'(y) / p_D(y)) = sum_t log(1 - q + q e^(mu y_t - mu^2 / 2)) of
    `transcripts` simulated transcripts y of T projected releases under D (which = 0) or D' (1), mu = 1 /
    sigma. A threshold on L is the Neyman-Pearson test of the pair: at threshold eps, P_D'(L > eps) -
    e^eps P_D(L > eps) is the pair's delta(eps), so the bound below can reach the exact epsilon."""
    mu, q = 1.0 / SIGMA, COMPOSED_BATCH / COMPOSED_POPULATION
    rng = np.random.default_rng((seed, stream, which))
    out = np.empty(transcripts)
    chunk = 50_000  # 4 MB of releases at a time
    for start in range(0, transcripts, chunk):
        size = min(chunk, transcripts - start)
        releases = rng.standard_normal((size, COMPOSED_RELEASES))
        if which:
            releases += mu * (rng.random((size, COMPOSED_RELEASES)) < q)  # the record in the batch
        out[start : start + size] = np.log1p(q * np.expm1(mu * releases - mu * mu / 2)).sum(axis=1)
    return out


@cache
def composed_epsilon_bound(seed: int = COMPOSED_SEED) -> float:
    """The Clopper-Pearson lower bound on epsilon at CP_DELTA (confidence 1 - ALPHA) of the T-release
    transcripts: the threshold on L (among the pooled pilot losses' upper quantiles: D' differs from D in
    L's upper tail) that the pilot transcripts make best, its error rates bounded on the audit transcripts.

    At COMPOSED_SEED: 2.352. Over seeds 9100-9119: mean 2.329, sd 0.050, range 2.234-2.412, i.e. 0.84 of
    the price on average: the gap of the pair to the price is 0.19, the bound's confidence margin and the
    threshold's distance from the optimum (eps) the other 0.24. Chosen thresholds 2.0-2.5 (mostly 2.3),
    where ~700 of D's 300,000 audit transcripts and ~12,000 of D''s lie above."""
    pilot_d, pilot_d_prime = (composed_losses(which, COMPOSED_PILOT, 0, seed) for which in (0, 1))
    candidates = np.quantile(np.concatenate([pilot_d, pilot_d_prime]), np.linspace(0.5, 0.999, 100))
    threshold = max(
        candidates, key=lambda t: epsilon_lower_bound(pilot_d, pilot_d_prime, float(t), CP_DELTA, ALPHA)
    )
    under_d, under_d_prime = (composed_losses(which, COMPOSED_TRANSCRIPTS, 1, seed) for which in (0, 1))
    return epsilon_lower_bound(under_d, under_d_prime, float(threshold), CP_DELTA, ALPHA)


def composed_charge() -> float:
    """What the ledger reports spent after the real gate made the job's T releases of S of N rows (a private
    store, so the gate's own sampler and generator). The accountant is `pld`, the tight price of releases
    fixed in advance (the budget's filter charges more: tests/privacy_wall/accounting/test_filter.py audits
    it), named so that a VIPS_ACCOUNTANT in the environment does not change what is audited."""
    contract = dpvi_tests.TestDpviQuery()
    query = contract.make_query()
    rows = contract.make_batch(np.random.default_rng(COMPOSED_SEED), COMPOSED_POPULATION)
    ledger = InMemoryLedger(delta=CP_DELTA, accountant=get_accountant(PldAccountant.name))
    gate = Gate(contract.make_store("composed", rows, public=False), ledger)
    for t in range(COMPOSED_RELEASES):
        gate.release(
            query,
            contract.calibration_params(),
            job_id="composed",
            iteration=t + 1,
            sigma=SIGMA,
            batch_size=COMPOSED_BATCH,
        )
    # The simulated transcripts model exactly these charges.
    event = SubsampledGaussianEvent(SIGMA, COMPOSED_BATCH, COMPOSED_POPULATION)
    assert [charge.event for charge in ledger.charges()] == [event] * COMPOSED_RELEASES
    return ledger.epsilon_spent()


@contextmanager
def underpriced(where: str, factor: float) -> Iterator[None]:
    """The ledger's subsampled price times `factor`: the FFT composition of the releases' C_q PLDs
    (`pld.epsilon`, which the accountant takes the least of with two looser bounds), or the accountant's
    whole answer. Cached prices are dropped on the way in and out: none computed under the mutation
    survives it."""
    real_pld, real_accountant = pld.epsilon, PldAccountant.epsilon

    def composition(groups: tuple[pld.Group, ...], delta: float) -> float:
        return factor * real_pld(groups, delta)

    def accountant(self: PldAccountant, cost: PrivacyCost, delta: float) -> float:
        return factor * real_accountant(self, cost, delta)

    patch = (
        mock.patch.object(pld, "epsilon", composition)
        if where == "pld"
        else mock.patch.object(PldAccountant, "epsilon", accountant)
    )
    clear_caches()
    try:
        with patch:
            yield
    finally:
        clear_caches()


def test_composed_subsampled_audit() -> None:
    """T = 10 releases at q = 1/4: the epsilon lower bound of the composed pair stays below what the ledger
    charges (2.760 at CP_DELTA), and reaches COMPOSED_MIN_FRACTION of it.

    False failures. The two Clopper-Pearson bounds (ALPHA / 2 each) hold jointly with probability >= 1 -
    ALPHA for any threshold chosen without the audit transcripts, and then the bound is <= the pair's exact
    epsilon (2.571) <= the price of a correct accountant: a correct ledger fails the first assertion with
    probability <= ALPHA = 1e-3 over seeds (this one, 0.19 above the pair, far less: the price is 8.5 sd
    above the bound's mean). The power assertion (>= 0.7 x 2.760 = 1.932) sits 7.9 sd below the bound's
    mean (2.329, sd 0.050 over 20 seeds; the bound is a smooth function of two binomial counts of ~700 and
    ~12,000 and of the pilot's threshold, about normal): ~1e-15 under the normal model, and 0.30 below the
    lowest of the 20 seeds' bounds. With the fixed seeds the test is deterministic (2.352 here)."""
    charged = composed_charge()
    lower = composed_epsilon_bound()
    assert lower <= charged, f"epsilon >= {lower:.3f} at confidence 1 - {ALPHA:g}, charged {charged:.3f}"
    assert lower >= COMPOSED_MIN_FRACTION * charged, f"no power ({lower:.3f} vs {charged:.3f})"


@pytest.mark.parametrize("where", ["pld", "accountant"])
def test_composed_subsampled_audit_detects_underpricing(where: str) -> None:
    """The same releases, charged by a ledger whose subsampled price is 0.6 x the real one (1.656): the
    audit's bound exceeds it, so the audit above would fail. This runs the real gate and ledger with the
    mutation in place (a copy of the price, or an audit that priced the schedule itself, would not see
    it); the mutated price is checked to be what the ledger charged. The bound's mean is 13 sd above
    1.656 (mean 2.329, sd 0.050 over 20 seeds, lowest 2.234): a false failure has probability ~1e-40
    under the normal model. (The single-release audits above pass at 0.6 x.)"""
    real = composed_charge()
    with underpriced(where, UNDERPRICING):
        charged = composed_charge()
    assert charged == pytest.approx(UNDERPRICING * real, rel=1e-9), (charged, real)
    lower = composed_epsilon_bound()
    assert lower > charged, f"a {UNDERPRICING} x price ({charged:.3f}) passes the audit ({lower:.3f})"
