"""The public half of a VIPS model: what runs on released statistics only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
from numpy.typing import NDArray

from privacy_wall.queries.base import Query

Array = NDArray[np.float64]
State = TypeVar("State")


class VipsModel(Protocol[State]):
    """M-step, expected natural parameters and the posterior document of one model."""

    @property
    def name(self) -> str: ...

    def initial_state(self, dimension: int) -> State:
        """The variational posterior before any data (the prior)."""
        ...

    def public_params(self, state: State) -> dict[str, Array]:
        """Expected natural parameters the wall's E-step needs."""
        ...

    def m_step(
        self,
        state: State,
        statistics: dict[str, Array],
        population: int,
        rho: float,
        noise_std: Mapping[str, float] | None = None,
    ) -> State:
        """nu_hat = nu + N s; nu_t = (1 - rho) nu_{t-1} + rho nu_hat; then the dependent factors.

        noise_std: the std of the Gaussian noise on each released block's mean (public, from the release);
        a model may use it in post-processing (BLR's noise-aware step) or ignore it."""
        ...

    def posterior(self, state: State) -> dict[str, Any]:
        """JSON-ready natural, sufficient and variational parameters, and what prediction needs."""
        ...


@dataclass(frozen=True)
class ModelSetup:
    """The public half (M-step, posterior) and the wall's query (E-step) of one job."""

    model: VipsModel[Any]
    query: Query


def model_options(options: Mapping[str, float]) -> dict[str, Any]:
    """A job's options less the VIPS loop's step sizes (tau0, kappa), which are not the model's."""
    return {name: value for name, value in options.items() if name not in ("tau0", "kappa")}
