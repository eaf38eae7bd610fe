"""VIPS from Python: the scikit-learn estimators, the shared PrivacyBudget and the public-bounds scaler,
and the Client of a VIPS service for notebooks (vips.client).

    from vips import VIPSLogisticRegression, PrivacyBudget
    budget = PrivacyBudget(epsilon=1.0, delta=1e-5)
    model = VIPSLogisticRegression(epsilon=0.4, data_norm=5.0, budget=budget).fit(X, y)

    from vips import Client
    model = Client().fit("adult", "blr", epsilon=0.5)   # VIPS_URL, VIPS_API_KEY: a fitted estimator

The names load on first use (module __getattr__), so `import vips` and the `vips` CLI stay light: neither
imports scikit-learn until an estimator is asked for.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from privacy_wall.ledger.base import BudgetExceeded
    from service.http.client import ApiConnectionError, ApiError
    from vips.budget import BudgetCharge, PrivacyBudget
    from vips.client import Client, JobFailed
    from vips.estimators import (
        DPSEPLinearRegression,
        DPSEPLogisticRegression,
        DPVILogisticRegression,
        VipsEstimator,
        VIPSLatentDirichletAllocation,
        VIPSLinearRegression,
        VIPSLogisticRegression,
        VIPSSigmoidBeliefNetwork,
    )
    from vips.preprocessing import DataNormWarning, PublicBoundsScaler

#: Each public name and the module that defines it.
_LAZY: dict[str, str] = {
    "VipsEstimator": "vips.estimators",
    "VIPSLogisticRegression": "vips.estimators",
    "DPVILogisticRegression": "vips.estimators",
    "DPSEPLogisticRegression": "vips.estimators",
    "VIPSLinearRegression": "vips.estimators",
    "DPSEPLinearRegression": "vips.estimators",
    "VIPSLatentDirichletAllocation": "vips.estimators",
    "VIPSSigmoidBeliefNetwork": "vips.estimators",
    "PrivacyBudget": "vips.budget",
    "BudgetCharge": "vips.budget",
    "BudgetExceeded": "privacy_wall.ledger.base",
    "PublicBoundsScaler": "vips.preprocessing",
    "DataNormWarning": "vips.preprocessing",
    "Client": "vips.client",
    "JobFailed": "vips.client",
    "ApiError": "service.http.client",
    "ApiConnectionError": "service.http.client",
}

__all__ = [
    "ApiConnectionError",
    "ApiError",
    "BudgetCharge",
    "BudgetExceeded",
    "Client",
    "DPSEPLinearRegression",
    "DPSEPLogisticRegression",
    "DPVILogisticRegression",
    "DataNormWarning",
    "JobFailed",
    "PrivacyBudget",
    "PublicBoundsScaler",
    "VIPSLatentDirichletAllocation",
    "VIPSLinearRegression",
    "VIPSLogisticRegression",
    "VIPSSigmoidBeliefNetwork",
    "VipsEstimator",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use and cache the name here."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vips' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names (loaded or not) beside the module's own."""
    return sorted(set(globals()) | set(__all__))
