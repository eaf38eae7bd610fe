"""The CLI's choices and defaults. Imports nothing, so `vips --help` builds its parser without numpy."""

from __future__ import annotations

KINDS = ("tabular", "regression", "bow", "binary")
MODELS = ("blr", "linreg", "lda", "sbn")
ALGORITHMS = ("vips", "dpvi", "dpsep")
#: Names other tools give the models, and the model each means here (a mistyped --model names it).
MODEL_ALIASES = {
    "logreg": ("blr", "logistic regression"),
    "logistic": ("blr", "logistic regression"),
    "logit": ("blr", "logistic regression"),
    "lr": ("blr", "logistic regression"),
    "logisticregression": ("blr", "logistic regression"),
    "linearregression": ("linreg", "linear regression"),
    "linear": ("linreg", "linear regression"),
    "ols": ("linreg", "linear regression"),
    "topics": ("lda", "a topic model"),
    "sigmoid": ("sbn", "a sigmoid belief network"),
}
DEFAULT_LABEL = "label"
DEFAULT_DELTA = 1e-5
