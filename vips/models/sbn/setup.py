"""Which public half and wall query an SBN job runs (vips.models.registry calls `setup`): the paper's
K = 50 hidden units unless the job gives its own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vips.models.base import ModelSetup


def setup(
    options: Mapping[str, float],
    *,
    algorithm: str,
    vocabulary: Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
) -> ModelSetup:
    """VIPS's public half and query."""
    from privacy_wall.queries.sbn import DEFAULT_FREQUENCY_COPIES
    from vips.models.sbn.model import DEFAULT_HIDDEN, SigmoidBeliefNetwork

    sbn = SigmoidBeliefNetwork(
        hidden=int(options.get("hidden", DEFAULT_HIDDEN)),
        frequency_copies=int(options.get("frequency_copies", DEFAULT_FREQUENCY_COPIES)),
        init_scale=float(options.get("init_scale", 1.0)),
    )
    return ModelSetup(sbn, sbn.query())
