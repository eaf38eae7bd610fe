"""Per-record queries sum their clipped contributions in chunks of rows (issue 22, item 4): the sums equal
one pass over the whole batch up to floating-point order, so nothing about sensitivity changes, and the
temporaries are chunk x d instead of S x d."""

from __future__ import annotations

import numpy as np
import pytest

from privacy_wall.data.store import Batch
from privacy_wall.queries import base
from privacy_wall.queries.base import Query
from privacy_wall.queries.blr import LogisticRegressionQuery
from privacy_wall.queries.dpsep import DpSepLinearQuery, DpSepLogisticQuery
from privacy_wall.queries.dpvi import DpviLogisticRegressionQuery
from privacy_wall.queries.linreg import LinearRegressionQuery

N, D = 203, 5  # 29 chunks of 7; 20 of 10 and a last one of 3; or single rows


def batch(labels: str) -> Batch:
    rng = np.random.default_rng(11)
    x = rng.normal(size=(N, D))
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1.0)
    y = (rng.random(N) < 0.5).astype(np.float64) if labels == "binary" else rng.uniform(-1, 1, N)
    return Batch(x, y)


def params_for(query: Query) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    a = rng.normal(size=(D, D))
    if isinstance(query, LogisticRegressionQuery):
        return {"second_moment": a @ a.T}
    if isinstance(query, DpviLogisticRegressionQuery):
        return {"mean": rng.normal(size=D), "log_std": rng.normal(size=D) - 1, "eps": rng.normal(size=(3, D))}
    if isinstance(query, LinearRegressionQuery):
        return {}
    return {"cavity_mean": rng.normal(size=D), "cavity_covariance": a @ a.T / D + np.eye(D)}


QUERIES: list[tuple[Query, str]] = [
    (LogisticRegressionQuery(), "binary"),
    (LinearRegressionQuery(), "real"),
    (DpviLogisticRegressionQuery(clip=0.7, draws=3), "binary"),
    (DpSepLogisticQuery(clip=2.0), "binary"),
    (DpSepLinearQuery(clip=2.0, noise_precision=4.0), "real"),
]


@pytest.mark.parametrize("chunk", [7, 10, 1])
@pytest.mark.parametrize(("query", "labels"), QUERIES, ids=[q.name for q, _ in QUERIES])
def test_chunked_sums_equal_one_pass(
    query: Query, labels: str, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, params = batch(labels), params_for(query)
    whole = query.clipped_sums(data, params, np.random.default_rng(0))
    monkeypatch.setattr(base, "CHUNK_ELEMENTS", chunk * D)
    monkeypatch.setattr(base, "MIN_CHUNK_ROWS", 1)
    chunked = query.clipped_sums(data, params, np.random.default_rng(0))
    assert chunked.keys() == whole.keys()
    for name, value in whole.items():
        np.testing.assert_allclose(chunked[name], value, rtol=1e-12, atol=1e-12)
    # And one pass equals the sum of each record's own contribution (what the bound is about).
    singles = [query.clipped_sums(data.rows(n, n + 1), params, np.random.default_rng(0)) for n in range(N)]
    for name, value in whole.items():
        np.testing.assert_allclose(sum(s[name] for s in singles), value, rtol=1e-11, atol=1e-12)


def test_batch_rows_are_views_of_the_batch() -> None:
    data = batch("binary")
    part = data.rows(10, 20)
    assert part.size == 10 and np.shares_memory(part.features, data.features)
    assert part.labels is not None and data.labels is not None
    np.testing.assert_array_equal(part.labels, data.labels[10:20])
    assert data.rows(200, 260).size == 3
