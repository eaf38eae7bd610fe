"""Schedules the service chooses (issue 35, item 4): a job that gives only its epsilon gets T and S from
control.planning.schedules, from public facts alone (model, algorithm, N, epsilon) and deterministically; the
quote shows the schedule and why; explicit values win; the estimators and `vips fit --local` choose the
same way."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from control.planning.options import option_problem
from control.planning.schedules import (
    RULES,
    Rule,
    choose_schedule,
    chosen_options,
    job_scale,
    rule_batch,
    rule_for,
    rule_iterations,
    rule_options,
)
from tests.dbservers import fresh_database
from tests.test_api import Api, N, make_api
from vips import fit_loop
from vips.cli import main
from vips.estimators import DPVILogisticRegression, VIPSLogisticRegression
from vips.models.blr.model import BayesianLogisticRegression


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with fresh_database("sqlite", tmp_path, "control") as url:
        yield from make_api(url, tmp_path)


# ---- the rule ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "algorithm"), sorted(RULES))
def test_every_rule_gives_a_valid_schedule_at_every_scale(model: str, algorithm: str) -> None:
    rule = rule_for(model, algorithm)
    bounds = [bound for bound, _ in rule.iterations]
    assert bounds == sorted(bounds) and math.isinf(bounds[-1]) and rule.source
    batch_bounds = [bound for bound, _ in rule.batch_fractions]
    assert batch_bounds == sorted(batch_bounds) and math.isinf(batch_bounds[-1])
    for population in (1, 7, 100, 3_000, 32_561, 400_000):
        for epsilon in (0.01, 0.1, 0.3, 1.0, 3.0, 10.0, None):
            chosen = choose_schedule(model, algorithm, population, epsilon)
            again = choose_schedule(model, algorithm, population, epsilon)
            assert chosen == again  # deterministic: a quote and its job agree
            assert chosen.iterations >= 1 and 1 <= chosen.batch_size <= population
            assert chosen.auto == ("iterations", "batch_size", *chosen.options)
            assert chosen.why.startswith("auto")
            assert not problems(model, algorithm, chosen.options)  # every chosen option is a valid one
            if epsilon is None:  # a job that gives sigma keeps the model's defaults
                assert chosen.options == {}
    option_bounds = [bound for bound, _ in rule.options]
    assert option_bounds == sorted(option_bounds) and (not option_bounds or math.isinf(option_bounds[-1]))


def problems(model: str, algorithm: str, options: dict[str, float]) -> list[str]:
    return [p for name, value in options.items() if (p := option_problem(model, name, value, algorithm))]


def test_vips_blr_takes_whole_batch_releases_by_log_loss_and_coverage() -> None:
    """With epsilon, S = N and T by scale epsilon x N x sqrt(10 / d): one Polya-Gamma release up to 400;
    above, Laplace releases with a gradient bound from the first (its curvature left out of the pool):
    three with bound 0.2 up to 2,000 (docs/schedules.md, "VIPS-BLR: small scales"), five with 0.25 up to
    4,000 and 0.3 up to 8,000, then five from the second with 0.35 (docs/schedules.md, "VIPS-BLR: the
    gradient bound"); a job that gives sigma keeps T 10 and the model's defaults (Laplace from the
    second, no bound)."""
    rule = rule_for("blr", "vips")
    scales = (1e-3, 400.0, 401.0, 2_000.0, 2_001.0, 8e3, 8_001.0, 1e300, math.inf)
    assert [rule_iterations(rule, scale) for scale in scales] == [1, 1, 3, 3, 5, 5, 5, 5, 10]
    first = {"laplace_from": 1.0, "pool_from": 2.0}
    assert [
        rule_options(rule, scale, {}) for scale in (400.0, 401.0, 2_000.0, 2_001.0, 4_001.0, 8_001.0, 1e300)
    ] == [
        {"laplace_from": 0.0},
        {**first, "gradient_bound": 0.2},
        {**first, "gradient_bound": 0.2},
        {**first, "gradient_bound": 0.25},
        {**first, "gradient_bound": 0.3},
        {"laplace_from": 2.0, "gradient_bound": 0.35},
        {"laplace_from": 2.0, "gradient_bound": 0.35},
    ]
    # (N, epsilon, d, T, options): Telco at 0.1, 0.3, 1 and 3, Adult at 0.3 and 1, the synthetic sets at 1.
    for population, epsilon, dimension, t, expected in (
        (4_930, 0.1, 41, 1, {"laplace_from": 0}),
        (4_930, 0.3, 41, 3, {**first, "gradient_bound": 0.2}),
        (4_930, 1.0, 41, 5, {**first, "gradient_bound": 0.25}),
        (32_561, 0.3, 114, 5, {**first, "gradient_bound": 0.25}),
        (4_930, 3.0, 41, 5, {**first, "gradient_bound": 0.3}),
        (32_561, 1.0, 114, 5, {"laplace_from": 2, "gradient_bound": 0.35}),
        (10_000, 1.0, 10, 5, {"laplace_from": 2, "gradient_bound": 0.35}),
    ):
        chosen = choose_schedule("blr", "vips", population, epsilon, dimension=dimension)
        assert (chosen.iterations, chosen.batch_size) == (t, population), (population, epsilon)
        options = chosen_options("blr", "vips", population, epsilon, dimension=dimension)
        assert options == expected
    with_sigma = choose_schedule("blr", "vips", 32_561, None)
    assert (with_sigma.iterations, with_sigma.batch_size) == (10, 32_561)
    assert chosen_options("blr", "vips", 32_561, None) == {}
    assert BayesianLogisticRegression().laplace_from == 2


def test_dpvi_takes_full_batches_up_to_a_scale_then_its_usual_schedule_with_a_floor_on_the_batch() -> None:
    """Under the budget's filter full-batch releases are priced exactly and subsampled ones by Renyi: up
    to epsilon x N = 150,000, 300 steps on the whole dataset; above (and with sigma given), the usual
    1,000 steps on N/50 rows, at least 100 (docs/schedules.md)."""
    for population, epsilon in ((32_561, 0.3), (32_561, 3.0), (4_930, 10.0), (100_000, 1.5)):
        chosen = choose_schedule("blr", "dpvi", population, epsilon)
        assert (chosen.iterations, chosen.batch_size) == (300, population)
    for population, epsilon in ((32_561, 10.0), (100_000, 1.6), (32_561, None)):
        chosen = choose_schedule("blr", "dpvi", population, epsilon)
        assert (chosen.iterations, chosen.batch_size) == (1000, round(population / 50))
    rule = rule_for("blr", "dpvi")
    assert rule_batch(rule, 2_000) == 100  # N / 50 = 40 rows: too few per step
    assert rule_batch(rule, 60) == 60 and rule_batch(rule, 60, scale=30.0) == 60
    assert rule_batch(rule, 2_000, scale=2_000.0) == 2_000


def test_given_values_win_and_the_rule_fills_the_rest() -> None:
    given = {"learning_rate": 0.5}
    both = choose_schedule("blr", "dpvi", 32_561, 0.3, iterations=300, batch_size=1_000, options=given)
    assert (both.iterations, both.batch_size, both.auto, both.why) == (300, 1_000, (), "given")
    fills = choose_schedule("blr", "dpvi", 32_561, 0.3, iterations=300, batch_size=1_000)
    assert (fills.auto, fills.options) == (("learning_rate",), {"learning_rate": 1.0})
    only_t = choose_schedule("blr", "dpvi", 32_561, 10.0, iterations=300)
    assert (only_t.iterations, only_t.batch_size, only_t.auto) == (300, 651, ("batch_size", "learning_rate"))
    capped = choose_schedule("blr", "dpvi", 32_561, 10.0, max_iterations=500)
    assert capped.iterations == 500


def test_a_rule_chooses_model_options_by_scale_and_given_ones_win(monkeypatch: pytest.MonkeyPatch) -> None:
    rule = Rule(iterations=((math.inf, 2),), options=((1e3, {"a0": 5.0, "b0": 2.0}), (math.inf, {"a0": 1.0})))
    monkeypatch.setitem(RULES, ("blr", "vips"), rule)
    small = choose_schedule("blr", "vips", 1_000, 0.5)
    assert small.options == {"a0": 5.0, "b0": 2.0} and small.auto == ("iterations", "batch_size", "a0", "b0")
    assert "a0 = 5, b0 = 2" in small.why
    assert choose_schedule("blr", "vips", 1_000, 2.0).options == {"a0": 1.0}
    given = choose_schedule("blr", "vips", 1_000, 0.5, iterations=3, batch_size=10, options={"a0": 7.0})
    assert given.options == {"b0": 2.0} and given.auto == ("b0",)
    assert choose_schedule("blr", "vips", 1_000, None).options == {}


def test_dpvi_takes_its_learning_rate_by_epsilon_n() -> None:
    """DPVI-BLR's rule: AdaGrad's default 0.5 up to epsilon x N = 2,000 (Telco at 0.3), 1.5 up to 5,000
    (the synthetic sets at 0.3, Telco at 1), 1 above (Adult, the synthetic sets from 1); a job that gives
    sigma keeps the model's default."""
    assert choose_schedule("blr", "dpvi", 4_930, 0.3).options == {"learning_rate": 0.5}
    assert choose_schedule("blr", "dpvi", 10_000, 0.3).options == {"learning_rate": 1.5}
    assert choose_schedule("blr", "dpvi", 4_930, 1.0).options == {"learning_rate": 1.5}
    assert choose_schedule("blr", "dpvi", 10_000, 1.0).options == {"learning_rate": 1.0}
    assert choose_schedule("blr", "dpvi", 32_561, 3.0).options == {"learning_rate": 1.0}
    assert choose_schedule("blr", "dpvi", 32_561, None).options == {}


def test_dpsep_takes_noise_aware_releases_and_fewer_at_small_scales() -> None:
    """DP-SEP-BLR's rule, read at epsilon x N x sqrt(10 / d): the noise-aware mode with clip 0.3 up to 8,000
    (Telco, d 41, at epsilon 0.3: 730; synthetic d 10 at epsilon 0.3: 3,000; Adult, d 114, at 0.3: 2,893)
    and 0.35 above (synthetic at 1: 10,000); T 2 up to 1,000, 3 up to 2,000, 5 above and for a job that
    gives sigma, which keeps the model's defaults; a given option is kept."""
    near, far = {"clip": 0.3, "noise_aware": 1.0}, {"clip": 0.35, "noise_aware": 1.0}
    telco = choose_schedule("blr", "dpsep", 4_930, 0.3, dimension=41)
    assert (telco.options, telco.iterations) == (near, 2)
    assert choose_schedule("blr", "dpsep", 4_930, 0.6, dimension=41).iterations == 3  # 1,460
    assert choose_schedule("blr", "dpsep", 32_561, None).iterations == 5
    assert choose_schedule("blr", "dpsep", 10_000, 0.3, dimension=10).options == near
    assert choose_schedule("blr", "dpsep", 32_561, 0.3, dimension=114).options == near
    assert choose_schedule("blr", "dpsep", 4_930, 1.0, dimension=41).options == near
    assert choose_schedule("blr", "dpsep", 10_000, 1.0, dimension=10).options == far
    assert choose_schedule("blr", "dpsep", 32_561, None).options == {}
    assert choose_schedule("blr", "dpsep", 32_561, 1.0, options={"clip": 1.0}).options == {"noise_aware": 1.0}
    assert choose_schedule("blr", "dpsep", 32_561, 1.0, dimension=114).iterations == 5


def test_the_quote_names_the_coverage_tested_at_a_small_scale() -> None:
    """Issue 51: where the tests found intervals narrower than nominal (control.planning.coverage: a band
    with a caution), the schedule's reason says so before anything is spent; elsewhere it says nothing."""
    from control.planning.coverage import TESTED

    for algorithm in ("vips", "dpvi", "dpsep"):
        _, covered, caution = TESTED[("blr", algorithm)].band(1_000.0)
        small = choose_schedule("blr", algorithm, 1_000, 1.0, dimension=10)
        assert (
            caution and f"covered {covered} of known weights in tests at this scale: {caution}" in small.why
        )
        assert (
            "of known weights in tests"
            not in choose_schedule("blr", algorithm, 10_000, 1.0, dimension=10).why
        )
    assert "in tests" not in choose_schedule("blr", "vips", 1_000, None, dimension=10).why  # sigma given
    paper = choose_schedule("blr", "dpsep", 1_000, 1.0, dimension=10, options={"noise_aware": 0})
    assert "in tests" not in paper.why
    # a job that sets the schedule itself (its T, or an option the rule would choose) was not measured
    assert "in tests" not in choose_schedule("blr", "vips", 1_000, 1.0, iterations=20, dimension=10).why
    own = choose_schedule("blr", "vips", 1_000, 1.0, options={"laplace_from": 2.0}, dimension=10)
    assert "in tests" not in own.why


def test_lda_reads_its_rows_per_topic_word_count() -> None:
    """LDA's rows were read at K V = 100,000 (K 20, V 5,000): 3,000 documents at epsilon 1 take the
    fallback's largest share; 4 topics over 50 words (500 times fewer counts, each with that much more
    signal to noise) read the row 500 times further on, where the topics get the whole release; a job that
    gives sigma keeps the model's defaults."""
    rule = rule_for("lda", "vips")
    assert rule.reference_size == 100_000
    wide = choose_schedule("lda", "vips", 3_000, 1.0, dimension=5_000, options={"topics": 20})
    assert wide.options["unigram_share"] == max(row["unigram_share"] for _, row in rule.options)
    narrow = choose_schedule("lda", "vips", 3_000, 1.0, dimension=50, options={"topics": 4})
    far = choose_schedule("lda", "vips", 1_500_000, 1.0, dimension=5_000, options={"topics": 20})
    assert (narrow.options, narrow.iterations) == (far.options, far.iterations)
    assert narrow.options == {"unigram_share": 0.0}
    assert "x 100000 / 200 entries: 1.5e+06" in narrow.why
    default_topics = choose_schedule("lda", "vips", 3_000, 1.0, dimension=5_000)  # K 10: twice the scale
    assert default_topics.why.endswith(wide.why[wide.why.index("from ") :])
    assert "/ 50000 entries: 6e+03" in default_topics.why
    assert choose_schedule("lda", "vips", 3_000, None, dimension=50).options == {}


# ---- through the service --------------------------------------------------------------------------------


def test_a_job_with_only_epsilon_gets_the_rules_schedule_and_the_quote_says_why(api: Api) -> None:
    expected = choose_schedule("blr", "vips", N, 1.0, dimension=3)  # the API's dataset: features a, b, c
    quote = api.submit(iterations=None, batch_size=None, sigma=None, epsilon=1.0, dry_run=True)
    assert quote.status_code == 200, quote.text
    body = quote.json()
    assert (body["iterations"], body["batch_size"]) == (expected.iterations, expected.batch_size)
    schedule = body["schedule"]
    assert schedule["auto"] == ["iterations", "batch_size", *expected.options] == list(expected.auto)
    assert schedule["why"] == expected.why
    assert "epsilon x N = 1e+03" in schedule["why"] and "docs/schedules.md" in schedule["why"]
    assert body["epsilon_job"] == pytest.approx(1.0, rel=1e-3)  # sigma calibrated for the chosen T and S
    job = api.submit(iterations=None, batch_size=None, sigma=None, epsilon=1.0).json()
    assert (job["iterations"], job["batch_size"]) == (expected.iterations, expected.batch_size)


def test_explicit_iterations_win_over_the_rule_and_sigma_keeps_the_old_default(api: Api) -> None:
    quote = api.submit(iterations=7, batch_size=None, sigma=None, epsilon=1.0, dry_run=True).json()
    chosen = list(chosen_options("blr", "vips", N, 1.0, dimension=3))  # the rule's options at 1,826
    assert (quote["iterations"], quote["schedule"]["auto"]) == (7, ["batch_size", *chosen])
    assert chosen == ["laplace_from", "pool_from", "gradient_bound"]
    given = api.submit(dry_run=True).json()["schedule"]
    assert (given["auto"], given["why"]) == ([], "given")
    with_sigma = api.submit(iterations=None, batch_size=None, sigma=2.0, dry_run=True).json()
    assert (with_sigma["iterations"], with_sigma["batch_size"]) == (10, N)
    assert "sigma given" in with_sigma["schedule"]["why"]


def test_a_resubmission_of_an_automatic_schedule_replays_its_job(api: Api) -> None:
    headers = {"Authorization": f"Bearer {api.keys['analyst']}", "Idempotency-Key": "auto-1"}
    body = {"dataset": "priv", "model": "blr", "epsilon": 1.0}
    first = api.client.post("/v1/jobs", json=body, headers=headers)
    again = api.client.post("/v1/jobs", json=body, headers=headers)
    assert first.status_code == again.status_code == 202, again.text
    assert again.json()["id"] == first.json()["id"] and again.headers["Idempotent-Replayed"] == "true"


def test_the_options_a_rule_chooses_are_quoted_stored_and_replayed(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chosen options show in the quote, run with the job (its stored options) and a resubmission of the
    same spec replays the job; the job's own options win."""
    rule = Rule(iterations=((math.inf, 1),), options=((math.inf, {"a0": 3.0, "noise_aware": 0.0}),))
    monkeypatch.setitem(RULES, ("blr", "vips"), rule)
    quote = api.submit(iterations=None, batch_size=None, sigma=None, epsilon=1.0, dry_run=True).json()
    assert quote["schedule"]["options"] == {"a0": 3.0, "noise_aware": 0}
    assert quote["schedule"]["auto"] == ["iterations", "batch_size", "a0", "noise_aware"]
    headers = {"Authorization": f"Bearer {api.keys['analyst']}", "Idempotency-Key": "auto-options"}
    body = {"dataset": "priv", "model": "blr", "epsilon": 1.0, "options": {"a0": 2.0}}
    first = api.client.post("/v1/jobs", json=body, headers=headers)
    assert first.status_code == 202, first.text
    assert first.json()["options"] == {"a0": 2.0, "noise_aware": 0}
    again = api.client.post("/v1/jobs", json=body, headers=headers)
    assert again.status_code == 202 and again.json()["id"] == first.json()["id"], again.text
    other = api.client.post("/v1/jobs", json={**body, "options": {"a0": 4.0}}, headers=headers)
    assert other.status_code == 409 and "options" in other.text


# ---- the estimators and vips fit --local ----------------------------------------------------------------


def _separable(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3))
    x *= 0.99 / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1.0)  # rows within the unit ball
    return x, (x @ np.array([2.0, -1.0, 0.5]) > 0).astype(int)


def test_the_estimators_choose_as_the_service_does(monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = _separable(2_000)
    for estimator in (VIPSLogisticRegression(epsilon=1.0), DPVILogisticRegression(epsilon=1.0)):
        privacy = estimator.fit(x, y).posterior_["privacy"]
        expected = choose_schedule("blr", estimator.algorithm, 2_000, 1.0, dimension=x.shape[1])
        assert (privacy["iterations"], privacy["batch_size"]) == (expected.iterations, expected.batch_size)
        assert privacy["epsilon"] <= 1.0 + 1e-9
    fixed = VIPSLogisticRegression(epsilon=1.0, iterations=2, batch_size=500).fit(x, y)
    assert (fixed.posterior_["privacy"]["iterations"], fixed.posterior_["privacy"]["batch_size"]) == (2, 500)
    # VIPS-BLR's rule reads epsilon x N x sqrt(10 / d): 10,000 rows of d 40 at epsilon 1 are at 5,000
    # (gradient bound 0.3), where epsilon x N alone would say 10,000 (0.35).
    rng = np.random.default_rng(1)
    wide = rng.normal(size=(10_000, 40))
    wide *= 0.99 / np.linalg.norm(wide, axis=1, keepdims=True)
    labels = (wide[:, 0] > 0).astype(int)
    assert rule_options(rule_for("blr", "vips"), 10_000.0, {})["gradient_bound"] == 0.35
    seen: list[dict[str, float]] = []
    setup = fit_loop.model_setup

    def spy(model: str, options: dict[str, float], **kwargs: Any) -> Any:
        seen.append(options)
        return setup(model, options, **kwargs)

    monkeypatch.setattr(fit_loop, "model_setup", spy)
    VIPSLogisticRegression(epsilon=1.0).fit(wide, labels)
    assert seen[-1]["gradient_bound"] == 0.3


def test_vips_fit_local_chooses_the_same_schedule(tmp_path: Path, capsys: Any) -> None:
    x, y = _separable(1_000)
    path = tmp_path / "t.csv"
    np.savetxt(path, np.column_stack([x, y]), delimiter=",", header="a,b,c,label", comments="", fmt="%.6f")
    argv = ["fit", "--local", "--kind", "tabular", "--input", str(path), "--model", "blr", "--epsilon", "1"]
    assert main([*argv, "--delta", "1e-4"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    expected = choose_schedule("blr", "vips", 1_000, 1.0, dimension=3)
    assert (line["iterations"], line["batch_size"]) == (expected.iterations, expected.batch_size)
    assert line["options"] == chosen_options("blr", "vips", 1_000, 1.0, dimension=3)  # what it ran with


def test_the_options_a_rule_may_choose_reach_the_walls_query() -> None:
    """frequency_copies and the unigram fallback are job options: model_setup hands them to the queries."""
    from privacy_wall.queries.lda import LdaQuery
    from privacy_wall.queries.sbn import SigmoidBeliefNetworkQuery
    from vips.models.registry import model_setup

    sbn = model_setup("sbn", {"frequency_copies": 2}, sigma=1.0).query
    assert isinstance(sbn, SigmoidBeliefNetworkQuery) and sbn.frequency_copies == 2
    lda = model_setup("lda", {"unigram_share": 0.8, "unigram_clip": 3.0}, sigma=1.0).query
    assert isinstance(lda, LdaQuery) and (lda.unigram_share, lda.unigram_clip) == (0.8, 3.0)
    default = model_setup("lda", {}, sigma=1.0).query
    assert isinstance(default, LdaQuery) and default.unigram_share == 0.0


def test_an_lda_job_with_only_epsilon_runs_the_fallback_the_rule_chooses(api: Api) -> None:
    """The service reads LDA's rule at the dataset's public V and the job's K: the quote shows the chosen
    unigram options and the admitted job stores them (the worker builds its query from the job's options)."""
    spec: dict[str, Any] = {
        "dataset": "docs",
        "model": "lda",
        "options": {"topics": 1000},
        "iterations": None,
        "batch_size": None,
        "sigma": None,
        "epsilon": 1.0,
    }
    expected = choose_schedule("lda", "vips", N, 1.0, options={"topics": 1000}, dimension=3)
    assert expected.options["unigram_share"] > 0
    quote = api.submit(**spec, dry_run=True).json()
    assert quote["schedule"]["options"] == expected.options
    assert quote["iterations"] == expected.iterations
    job = api.submit(**spec).json()
    assert job["options"] == {"topics": 1000, **expected.options}


def test_the_quote_says_what_the_scale_was_measured_to_give() -> None:
    """LDA's, the SBN's and logistic regression's small scales end `why` with what their sweeps measured
    there (docs/schedules.md); larger scales, jobs that give sigma and rules without such rows say nothing
    of it."""
    news = choose_schedule("lda", "vips", 3_000, 1.0, dimension=5_000, options={"topics": 50})  # scale 1,200
    assert news.why.endswith("; expect about the private word frequencies the fit falls back to (its "
                             "posterior's private_unigram): at this scale topics clear the noise only where "
                             "they are very strong")  # fmt: skip
    middle = choose_schedule("lda", "vips", 30_000, 1.0, dimension=5_000, options={"topics": 20})  # 30,000
    assert middle.why.endswith("; expect strong topics to pay; on encyclopedia or news text, about the "
                               "private word frequencies")  # fmt: skip
    large = choose_schedule("lda", "vips", 30_000, 10.0, dimension=5_000, options={"topics": 20})
    assert "expect" not in large.why
    assert "expect" not in choose_schedule("lda", "vips", 3_000, None, dimension=5_000).why
    pixels = choose_schedule("sbn", "vips", 4_000, 1.0)
    assert pixels.why.endswith("; expect about the pixel means: no hidden unit learns reliably at this scale")
    assert "expect" not in choose_schedule("sbn", "vips", 40_000, 1.0).why
    assert "expect" not in choose_schedule("blr", "vips", 1_000, 0.3).why  # 300
    for algorithm in ("vips", "dpsep"):  # scale 200: no algorithm reliably beat the base rate there
        tiny = choose_schedule("blr", algorithm, 1_000, 0.2, dimension=10)
        assert "; expect probabilities about as good as a constant prediction at the base rate" in tiny.why


def test_the_sbn_rule_reads_its_scale_at_784_pixels_and_50_units() -> None:
    """Issue 51: the SBN's weights' drive has noise sqrt(J K) per entry, so epsilon x N is read times
    sqrt(784 x 50 / (J K)); up to 25,000 the pixel-means release (T 3, 8 copies), above it one release from
    init_scale 3 (docs/schedules.md, "VIPS-SBN by held-out likelihood")."""
    digits = choose_schedule("sbn", "vips", 4_000, 5.0, dimension=784)  # 20,000
    assert (digits.iterations, digits.options) == (3, {"frequency_copies": 8})
    above = choose_schedule("sbn", "vips", 4_000, 6.5, dimension=784)  # 26,000
    assert (above.iterations, above.options) == (1, {"frequency_copies": 1, "init_scale": 3.0})
    fewer = choose_schedule("sbn", "vips", 1_000, 20.0, dimension=784, options={"hidden": 10})  # 44,700
    assert fewer.iterations == 1 and fewer.options["init_scale"] == 3.0
    small = choose_schedule("sbn", "vips", 4_000, 2.0, dimension=64)  # 8,000 x 3.5 = 28,000
    assert small.iterations == 1
    assert job_scale("sbn", "vips", 4_000, 2.0, {"hidden": 200}, 784) == pytest.approx(4_000.0)
