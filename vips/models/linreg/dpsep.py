"""DP-SEP's public half for linear regression (the algorithm and both models' sites:
vips.models.blr.dpsep's docstring, where the shared base DpSepModel lives)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from privacy_wall.queries.dpsep import BLOCK, NORMAL_GAMMA_SITE_BOUND, DpSepLinearQuery, DpSepNormalGammaQuery
from vips.models.base import Array
from vips.models.blr.dpsep import DpSepModel
from vips.models.linreg.model import BayesianLinearRegression, LinregState


@dataclass(frozen=True)
class DpSepLinearRegression(DpSepModel):
    """DP-SEP for linear regression, w ~ N(0, prior_variance I) a priori.

    noise_aware (default): the noise variance is unknown, the model Normal-Gamma (vips.models.linreg.model
    with w | tau ~ N(0, prior_variance / tau I), tau ~ Gamma(1, 0.01)); each record's exact site (y x, x x^T,
    y^2) is clipped jointly to C and released (privacy_wall.queries.dpsep, "Normal-Gamma sites"), the
    damped average of the releases is read as VIPS-linreg reads its statistics, and the release noise is
    propagated to the weights' covariance. clip None: sqrt(3), which clips nothing. noise_variance is then
    learned, not given.

    noise_aware False (the paper's model): y ~ N(w^T x, noise_variance) with a known noise variance (None:
    1, the largest possible for |y| <= 1); the exact site of a record is (tau y x, tau x x^T) with tau =
    1 / noise_variance, of natural-parameter norm tau ||x|| sqrt(y^2 + ||x||^2) <= sqrt(2) tau under the
    ingestion bounds; clip None takes that bound. Its intervals read the released site as exact.

    A clip below the bound trades bias (records with large |y| or ||x|| are down-weighted) for less noise;
    the sensitivity is fixed by public values only either way.
    """

    noise_variance: float | None = None
    clip: float | None = None
    noise_aware: bool = True
    name: str = "linreg"

    def __post_init__(self) -> None:
        self._check()
        if self.noise_variance is not None:
            if self.noise_aware:
                raise ValueError("noise_variance is learned in the noise-aware mode: it needs noise_aware 0")
            if not (self.noise_variance > 0 and math.isfinite(self.noise_variance)):
                raise ValueError("noise_variance must be a finite number > 0")
        if self.clip is not None and not (self.clip > 0 and math.isfinite(self.clip)):
            raise ValueError("clip must be a finite number > 0 (or None for the ingestion bound)")

    @property
    def known_noise_variance(self) -> float:
        """The paper's mode's noise variance (1 unless given)."""
        return 1.0 if self.noise_variance is None else float(self.noise_variance)

    @property
    def site_clip(self) -> float:
        if self.clip is not None:
            return float(self.clip)
        if self.noise_aware:
            return NORMAL_GAMMA_SITE_BOUND
        return math.sqrt(2.0) / self.known_noise_variance

    def query(self) -> DpSepLinearQuery | DpSepNormalGammaQuery:
        """The wall's query that pairs with this model."""
        if self.noise_aware:
            return DpSepNormalGammaQuery(self.site_clip)
        return DpSepLinearQuery(self.site_clip, 1.0 / self.known_noise_variance)

    @property
    def conjugate(self) -> BayesianLinearRegression:
        """The noise-aware mode's model: Normal-Gamma with the prior precision 1 / prior_variance."""
        return BayesianLinearRegression(prior_precision=1.0 / self.prior_variance)

    def initial_state(self, dimension: int) -> Any:
        if self.noise_aware:
            return self.conjugate.initial_state(dimension)
        return super().initial_state(dimension)

    def public_params(self, state: Any) -> dict[str, Array]:
        if isinstance(state, LinregState):
            return {}
        return super().public_params(state)

    def m_step(
        self,
        state: Any,
        statistics: dict[str, Array],
        population: int,
        rho: float,
        noise_std: Mapping[str, float] | None = None,
    ) -> Any:
        """The damped site average; in noise-aware mode of the Normal-Gamma natural parameters, with the
        release's one noise std on every entry of xx and yx (vips.models.linreg.model)."""
        if not isinstance(state, LinregState):
            return super().m_step(state, statistics, population, rho, noise_std)
        released = float((noise_std or {}).get(BLOCK, 0.0))
        noise = {"xx": released, "yx": released, "yy": released}
        return self.conjugate.m_step(state, statistics, population, self.damping * rho, noise)

    def posterior(self, state: Any) -> dict[str, Any]:
        if isinstance(state, LinregState):
            document = self.conjugate.posterior(state)
            document["variational_parameters"].update(
                prior_variance=self.prior_variance,
                damping=self.damping,
                clip=self.site_clip,
                noise_aware=True,
            )
            return document
        document = self._document(state)
        document["noise_variance"] = self.known_noise_variance
        document["variational_parameters"]["noise_variance"] = self.known_noise_variance
        return document
