"""The CLI's choices and defaults. Imports nothing, so `vips --help` builds its parser without numpy."""

from __future__ import annotations

KINDS = ("tabular", "regression", "bow", "binary")
MODELS = ("blr", "linreg", "lda", "sbn")
ALGORITHMS = ("vips", "dpvi", "dpsep")
DEFAULT_LABEL = "label"
DEFAULT_DELTA = 1e-5
