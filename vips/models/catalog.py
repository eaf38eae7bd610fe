"""Every model's facts by name (vips.models.spec): the one listing of the models. Adding a model adds its
folder's SPEC here (docs/adding-a-model.md); everything that asks which models there are, what kind of
data each fits, which algorithms fit it and with which options reads this. Imports only the specs."""

from __future__ import annotations

from vips.models.blr.spec import SPEC as BLR
from vips.models.lda.spec import SPEC as LDA
from vips.models.linreg.spec import SPEC as LINREG
from vips.models.sbn.spec import SPEC as SBN
from vips.models.spec import ALGORITHMS, ModelSpec

#: The models, by name, in the order the CLI and the docs list them.
MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in (BLR, LINREG, LDA, SBN)}
#: The dataset kinds, in the models' order.
KINDS: tuple[str, ...] = tuple(dict.fromkeys(spec.kind for spec in MODELS.values()))
#: The models each algorithm fits, in the models' order.
ALGORITHM_MODELS: dict[str, tuple[str, ...]] = {
    algorithm: tuple(name for name, spec in MODELS.items() if algorithm in spec.fitted_by())
    for algorithm in ALGORITHMS
}
#: Names other tools give the models -> (the model's name here, what it is).
MODEL_ALIASES: dict[str, tuple[str, str]] = {
    alias: (spec.name, spec.title) for spec in MODELS.values() for alias in spec.aliases
}
