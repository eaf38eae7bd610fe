"""Fitting a model through the real gate in tests, and the distances the recovery tests compare with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from privacy_wall.data.store import RowStore
from privacy_wall.gate import Gate, Release
from privacy_wall.ledger.base import InMemoryLedger
from privacy_wall.queries.base import Query
from vips.models.base import VipsModel
from vips.runner import LoopSettings, run_vips

State = TypeVar("State")


def fit_through_gate(
    store: RowStore,
    model: VipsModel[State],
    query: Query,
    settings: LoopSettings,
    *,
    seed: int | None = 0,
    on_iteration: Callable[[int, Release, State], None] | None = None,
) -> tuple[State, InMemoryLedger]:
    """run_vips over a Gate on `store` and a fresh InMemoryLedger (delta 1e-5). The gate is seeded only for
    a public store (sigma = 0 fits); a private store draws from the OS's CSPRNG, as in production."""
    ledger = InMemoryLedger(delta=1e-5)
    gate = Gate(store, ledger, seed=seed if store.info.public else None)
    result = run_vips(
        gate,
        query,
        model,
        settings,
        job_id="fit",
        dimension=store.info.dimension,
        population=store.info.population,
        on_iteration=on_iteration,
    )
    return result.state, ledger


def cosine(a: Any, b: Any) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def relative_error(a: Any, b: Any) -> float:
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(b))
