"""Which public half and which wall query a job runs, from its model, algorithm and options
(docs/design.md sections 5-6).

One place maps (model, algorithm, options) to (VipsModel, Query), for the worker's jobs, the in-process
estimators and `vips fit --local` alike. The rules on options live in control.planning.options (the API checks
them first); defaults are the papers' (LDA: K = 10, N_w = 500, a = 0.1; SBN: K = 50 hidden units) or the
models' own (vips.models).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from control.planning.options import (
    LDA_DEFAULTS,
    MODEL_KINDS,
    algorithm_problem,
    option_problem,
    schedule_problem,
)
from privacy_wall.data.store import MAX_COUNT
from privacy_wall.queries.base import Query
from vips.models.base import VipsModel
from vips.models.catalog import MODELS

# Each model's modules (and the wall's query for it) are imported by model_setup when a job of that model
# is set up: a process that fits LDA (`vips fit --local`) does not load the SBN, DPVI or DP-SEP code.

#: doc_length 0 (sigma 0 only, so no noise is calibrated to it): documents are kept as they are. The
#: query still declares a bound to clip to; this one is far above any real document's length.
UNCLIPPED_DOCUMENT_LENGTH = MAX_COUNT * 10_000


class ModelOptionError(ValueError):
    """Options that are not valid for the model (the message names the option)."""


@dataclass(frozen=True)
class ModelSetup:
    """The public half (M-step, posterior) and the wall's query (E-step) of one job."""

    model: VipsModel[Any]
    query: Query


def check_model_options(model: str, options: dict[str, float], sigma: float, algorithm: str = "vips") -> None:
    """Raise ModelOptionError naming the first invalid option (the API checks the same rules first)."""
    if model not in MODEL_KINDS:
        raise ModelOptionError(f"unknown model {model!r}; expected one of {', '.join(MODEL_KINDS)}")
    pairing = algorithm_problem(model, algorithm)
    if pairing is not None:
        raise ModelOptionError(pairing)
    for name, value in options.items():
        problem = option_problem(model, name, float(value), algorithm)
        if problem is not None:
            raise ModelOptionError(problem)
    conflict = schedule_problem(model, options, sigma)
    if conflict is not None:
        raise ModelOptionError(conflict[1])


def intercept_column(columns: Sequence[str] | None) -> int:
    """The column VIPS-BLR's intercept step treats as the intercept: the first one named "intercept" (as
    `vips scale` and PublicBoundsScaler name the column of 1s they add), or "<step>__intercept" (the name a
    scikit-learn ColumnTransformer gives it), else column 0, where they put it; the step itself checks that
    the column carries the features' means (vips.models.blr.model)."""
    names = [] if columns is None else [str(name) for name in columns]
    found = [j for j, name in enumerate(names) if name == "intercept" or name.endswith("__intercept")]
    return found[0] if found else 0


def model_setup(
    model: str,
    options: dict[str, float],
    *,
    sigma: float,
    algorithm: str = "vips",
    vocabulary: Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
) -> ModelSetup:
    """The model and query a job of `model` fitted by `algorithm` with `options` runs (step-size options
    tau0, kappa are the VIPS loop's, not the model's). `vocabulary`: an LDA dataset's public word list,
    for the unigram fallback's public prior (option word_prior). `columns`: a tabular dataset's public
    feature names, for VIPS-BLR's intercept step (`intercept_column`)."""
    check_model_options(model, options, sigma, algorithm)
    given: dict[str, Any] = {name: value for name, value in options.items() if name not in ("tau0", "kappa")}
    if algorithm == "dpvi":
        from vips.models.blr.dpvi import DpviLogisticRegression

        if "draws" in given:
            given["draws"] = int(given["draws"])
        if "noise_aware" in given:
            given["noise_aware"] = bool(given["noise_aware"])
        dpvi = DpviLogisticRegression(**given)
        return ModelSetup(dpvi, dpvi.query())
    if algorithm == "dpsep":
        from vips.models.dpsep import DpSepLinearRegression, DpSepLogisticRegression

        if "noise_aware" in given:
            given["noise_aware"] = bool(given["noise_aware"])
        dpsep: DpSepLogisticRegression | DpSepLinearRegression = (
            DpSepLogisticRegression(**given, intercept=intercept_column(columns))
            if model == "blr"
            else DpSepLinearRegression(**given)
        )
        return ModelSetup(dpsep, dpsep.query())
    if model == "blr":
        from privacy_wall.queries.blr import S1_BOUND, LogisticRegressionQuery
        from vips.models.blr.model import BayesianLogisticRegression

        if "noise_aware" in given:
            given["noise_aware"] = bool(given["noise_aware"])
        for whole in ("laplace_from", "pool_from"):
            if whole in given:
                given[whole] = int(given[whole])
        blr_query = LogisticRegressionQuery(float(given.pop("gradient_bound", S1_BOUND)))
        blr = BayesianLogisticRegression(**given, intercept=intercept_column(columns))
        return ModelSetup(blr, blr_query)
    if model == "linreg":
        from vips.models.linreg.model import BayesianLinearRegression

        linreg = BayesianLinearRegression(**given)
        return ModelSetup(linreg, linreg.query())
    if model == "lda":
        from privacy_wall.queries.lda import LdaQuery
        from vips.models.lda.model import LatentDirichletAllocation, default_smoothing

        topics = int(options.get("topics", LDA_DEFAULTS["topics"]))
        doc_length = int(options.get("doc_length", LDA_DEFAULTS["doc_length"]))
        unigram_share = float(options.get("unigram_share", 0.0))
        word_prior, source = None, None
        if unigram_share > 0 and vocabulary and options.get("word_prior", 1):
            from vips.models.lda.word_prior import english_prior

            word_prior, source = english_prior(vocabulary) or (None, None)
        lda = LatentDirichletAllocation(
            topics=topics,
            alpha=options.get("alpha"),
            eta=options.get("eta"),
            smoothing=float(options.get("smoothing", default_smoothing(doc_length))),
            word_prior=word_prior,
            word_prior_source=source,
        )
        query = LdaQuery(
            topics,
            alpha=lda.doc_topic_prior,
            doc_length=doc_length,
            clip=float(options.get("clip", LDA_DEFAULTS["clip"])),
            max_document_length=UNCLIPPED_DOCUMENT_LENGTH if doc_length == 0 else None,
            unigram_share=unigram_share,
            unigram_clip=float(options.get("unigram_clip", 1.0)),
        )
        return ModelSetup(lda, query)
    from privacy_wall.queries.sbn import DEFAULT_FREQUENCY_COPIES
    from vips.models.sbn.model import DEFAULT_HIDDEN, SigmoidBeliefNetwork

    sbn = SigmoidBeliefNetwork(
        hidden=int(options.get("hidden", DEFAULT_HIDDEN)),
        frequency_copies=int(options.get("frequency_copies", DEFAULT_FREQUENCY_COPIES)),
        init_scale=float(options.get("init_scale", 1.0)),
    )
    return ModelSetup(sbn, sbn.query())


def public_schema_extra(model: str, schema: dict[str, Any]) -> dict[str, Any]:
    """What a posterior carries from the dataset's public schema so that clients can use it on their own
    files (the model's spec's `public_extra`: LDA the vocabulary, SBN the column names, BLR and linreg the
    feature columns' names and the label's, by which inputs are matched; docs/posterior-format.md)."""
    spec = MODELS.get(model)
    extra = spec.public_extra if spec is not None else None
    return {} if extra is None else extra(schema)
