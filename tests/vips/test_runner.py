"""vips.runner: the loop rehearses its first update on a public stand-in before the first charge (issue 52).

Options outside the admitted ranges cannot reach the loop through the API, the CLI or the estimators
(control.planning.options); these tests build the model and query directly, as a new model or a future
option could, to show that the rehearsal stops such a job with nothing charged.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from privacy_wall.data.store import InMemoryBowStore, InMemoryTabularStore
from privacy_wall.queries.lda import LdaQuery
from tests.fitting import fit_through_gate
from vips.models.blr.dpvi import DpviLogisticRegression
from vips.models.lda.model import LatentDirichletAllocation
from vips.runner import LoopSettings, UnrunnableOptions


def documents(count: int = 60, words: int = 30, seed: int = 0) -> InMemoryBowStore:
    rng = np.random.default_rng(seed)
    return InMemoryBowStore("docs", sp.csr_array(rng.poisson(0.5, size=(count, words))), public=False)


def rows(count: int = 200, seed: int = 0) -> InMemoryTabularStore:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(count, 4))
    x /= 2 * np.linalg.norm(x, axis=1, keepdims=True)
    y = (rng.uniform(size=count) < 0.5).astype(np.float64)
    return InMemoryTabularStore("rows", x, y, public=False)


def test_an_update_that_divides_by_zero_fails_before_the_first_charge() -> None:
    """The attack's case: LDA's unigram clip 1e-300 makes the fallback's noise variance 0 and the M-step
    divided by it after the release had been charged."""
    store = documents()
    query = LdaQuery(3, doc_length=50, unigram_share=0.5, unigram_clip=1e-300)
    model = LatentDirichletAllocation(topics=3)
    with pytest.raises(UnrunnableOptions, match=r"ZeroDivisionError.*nothing was spent") as raised:
        fit_through_gate(store, model, query, LoopSettings(iterations=3, batch_size=60, sigma=2.0))
    assert "before anything was charged" in str(raised.value)


def test_an_update_that_overflows_fails_before_the_first_charge() -> None:
    """AdaGrad's first step moves each coordinate by the learning rate: 1e300 leaves q's standard
    deviations infinite."""
    store = rows()
    model = DpviLogisticRegression(learning_rate=1e300)
    with pytest.raises(UnrunnableOptions, match="non-finite values"):
        fit_through_gate(store, model, model.query(), LoopSettings(iterations=3, batch_size=50, sigma=2.0))


def test_runnable_options_are_charged_once_per_iteration_after_the_rehearsal() -> None:
    """The rehearsal releases and charges nothing: a fit of T iterations still makes exactly T charges."""
    store = documents()
    query = LdaQuery(3, doc_length=50, unigram_share=0.5, unigram_clip=1.0)
    settings = LoopSettings(iterations=3, batch_size=60, sigma=2.0)
    _, ledger = fit_through_gate(store, LatentDirichletAllocation(topics=3), query, settings)
    assert len(ledger.charges()) == 3
    model = DpviLogisticRegression()
    _, ledger = fit_through_gate(
        rows(), model, model.query(), LoopSettings(iterations=4, batch_size=50, sigma=2.0)
    )
    assert len(ledger.charges()) == 4


def test_a_sigma_below_the_floor_is_refused_as_the_api_refuses_it() -> None:
    """Issue 52 item 8: sigma 1e-12 was admitted (epsilon 5e23) while the quote's largest_epsilon, found
    over sigma >= SIGMA_MIN, was 504,264. A given sigma must be 0 (public data) or at least SIGMA_MIN on
    every path: the API (tests/test_api.py) and the estimators and `vips fit --local` (vips.fit_loop),
    before anything is charged."""
    from privacy_wall.accounting.sigma_range import SIGMA_MIN, sigma_problem
    from vips.estimators import VIPSLogisticRegression

    store = rows()
    x, y = store.features, store.labels
    for sigma in (1e-12, SIGMA_MIN / 2):
        with pytest.raises(ValueError, match=r"sigma must be 0 \(public data only\) or at least 0.001"):
            VIPSLogisticRegression(sigma=sigma, iterations=2).fit(x, y)
    assert sigma_problem(0.0) is None and sigma_problem(SIGMA_MIN) is None and sigma_problem(1e6) is None
    assert sigma_problem(float("nan")) is not None
