"""PrivacyBudget (issue 24.6): one budget shared by estimator fits, composed by the accountant, refusing
with the service's 409 message; shared through clone and threads, refused in pickled copies."""

from __future__ import annotations

import pickle
import re

import joblib
import numpy as np
import pytest
from sklearn.base import clone
from sklearn.model_selection import KFold, cross_val_score

from privacy_wall.accounting.accountants import get_accountant
from privacy_wall.accounting.events import SubsampledGaussianEvent
from privacy_wall.gate import PrivacyError
from privacy_wall.ledger.base import BudgetExceeded, budget_exceeded
from privacy_wall.ledger.refusals import refusal_detail
from vips.budget import PrivacyBudget
from vips.estimators import VIPSLogisticRegression


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 3))
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1.0)
    y = (x @ np.array([1.0, -1.0, 0.5]) + 0.1 * rng.normal(size=120) > 0).astype(int)
    return x, y


def model(budget: PrivacyBudget, epsilon: float = 0.4) -> VIPSLogisticRegression:
    return VIPSLogisticRegression(epsilon=epsilon, iterations=2, budget=budget)


def test_five_full_batch_fits_of_04_compose_to_0963_and_a_sixth_is_refused(
    data: tuple[np.ndarray, np.ndarray],
) -> None:
    budget = PrivacyBudget(epsilon=1.0, delta=1e-5)  # the filter, as the estimators' default
    x, y = data
    for _ in range(5):
        model(budget).fit(x, y)
    assert budget.spent == pytest.approx(0.963, abs=1e-3)  # composed, not 5 x 0.4 = 2
    assert budget.remaining == pytest.approx(1.0 - budget.spent)
    assert len(budget.history) == 5
    assert [round(c.epsilon, 3) for c in budget.history] == [0.4] * 5
    assert budget.history[-1].epsilon_spent == pytest.approx(budget.spent)
    before = budget.history
    with pytest.raises(BudgetExceeded) as refused:
        model(budget).fit(x, y)
    message = str(refused.value)
    assert re.fullmatch(
        r"dataset local: epsilon 0\.96\d* of 1 is spent or reserved \(delta 1e-05\); this would bring it "
        r"to 1\.0\d+; epsilon remaining 0\.03\d+; a job of this schedule could have at most epsilon "
        r"0\.\d+ \(submit it as epsilon\), more than what remains because spends compose rather than add "
        r"up: the budget's spend with that job composed is at most the cap",
        message,
    ), message
    assert budget.history == before  # a refusal charges nothing


def test_the_refusal_is_the_services_409_detail() -> None:
    budget = PrivacyBudget(epsilon=0.5, delta=1e-5, accountant="pld")
    event = SubsampledGaussianEvent(1.0, 100, 100)
    with pytest.raises(BudgetExceeded) as refused:
        budget.reserve("job", "adult", event, 10)
    after = get_accountant("pld").cost(event).scaled(10).epsilon(1e-5)
    service = refusal_detail(budget_exceeded("dataset adult", 0.0, 0.5, 1e-5, after), refused.value.budget)
    assert str(refused.value).split("; a job")[0] == service.split("; a job")[0]
    assert refused.value.budget == 0.5 and refused.value.spent == 0.0


def test_clone_and_cross_val_score_share_the_budget(data: tuple[np.ndarray, np.ndarray]) -> None:
    budget = PrivacyBudget(epsilon=5.0, delta=1e-5)
    estimator = model(budget)
    assert clone(estimator).budget is budget
    x, y = data
    cross_val_score(estimator, x, y, cv=KFold(3))
    assert len(budget.history) == 3
    assert 0.4 < budget.spent < 1.2


def test_threads_share_it(data: tuple[np.ndarray, np.ndarray]) -> None:
    budget = PrivacyBudget(epsilon=5.0, delta=1e-5)
    x, y = data
    with joblib.parallel_backend("threading"):
        cross_val_score(model(budget), x, y, cv=2, n_jobs=2)
    assert len(budget.history) == 2


def test_a_pickled_copy_reports_but_never_pays(data: tuple[np.ndarray, np.ndarray]) -> None:
    budget = PrivacyBudget(epsilon=5.0, delta=1e-5)
    x, y = data
    model(budget).fit(x, y)
    copy = pickle.loads(pickle.dumps(budget))
    assert copy.spent == budget.spent and copy.history == budget.history
    with pytest.raises(PrivacyError, match="pickled copy"):
        model(copy).fit(x, y)


def test_delta_must_match_and_sigma_zero_is_refused(data: tuple[np.ndarray, np.ndarray]) -> None:
    budget = PrivacyBudget(epsilon=5.0, delta=1e-6)
    x, y = data
    with pytest.raises(ValueError, match="budget's delta 1e-06"):
        model(budget).fit(x, y)
    public = VIPSLogisticRegression(sigma=0.0, iterations=1, delta=1e-6, budget=budget)
    with pytest.raises(BudgetExceeded):
        public.fit(x, y)  # sigma = 0 is infinitely expensive
    with pytest.raises(TypeError, match="PrivacyBudget"):
        VIPSLogisticRegression(epsilon=1.0, budget=1.0).fit(x, y)  # type: ignore[arg-type]


def test_racing_reservations_admit_exactly_what_fits() -> None:
    """20 threads reserve the same fit at once against a budget halfway between 3 and 4 composed fits:
    exactly 3 are admitted and nothing is over-reserved (the lock serialises admissions)."""
    import threading

    event = SubsampledGaussianEvent(2.0, 100, 1000)
    job = get_accountant("pld").cost(event).scaled(10)
    cap = (job.scaled(3).epsilon(1e-5) + job.scaled(4).epsilon(1e-5)) / 2
    budget = PrivacyBudget(epsilon=cap, delta=1e-5, accountant="pld")
    start = threading.Barrier(20)
    outcomes: list[str] = []

    def reserve(i: int) -> None:
        start.wait()
        try:
            budget.reserve(f"fit-{i}", "local", event, 10)
            outcomes.append("admitted")
        except BudgetExceeded:
            outcomes.append("refused")

    threads = [threading.Thread(target=reserve, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes.count("admitted") == 3 and outcomes.count("refused") == 17
    assert 0 < budget.remaining < cap - job.scaled(3).epsilon(1e-5) + 1e-9
