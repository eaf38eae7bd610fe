"""The CLI's choices and defaults. The models' choices come from their facts (vips.models.catalog), which
import only the standard library, so `vips --help` builds its parser without numpy."""

from __future__ import annotations

from vips.models.catalog import ALGORITHM_MODELS, KINDS, MODEL_ALIASES
from vips.models.catalog import MODELS as MODEL_SPECS

__all__ = ["ALGORITHMS", "DEFAULT_DELTA", "DEFAULT_LABEL", "KINDS", "MODELS", "MODEL_ALIASES"]

MODELS = tuple(MODEL_SPECS)
ALGORITHMS = tuple(ALGORITHM_MODELS)
DEFAULT_LABEL = "label"
DEFAULT_DELTA = 1e-5
