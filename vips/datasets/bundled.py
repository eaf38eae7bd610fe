"""The bundled CSV datasets' common loading (vips/datasets/data): a gzipped CSV with a header row, read
into dicts; the public, data-independent encoding of a tabular file (an intercept, numeric columns scaled
by fixed bounds, 0/1 columns, one-hot levels, rows of norm <= 1); and the fixed public 70% / 30% split
of a dataset without an official test split (a permutation by seed 0, whatever the rows)."""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from vips.datasets.adult import TabularData

__all__ = ["TRAIN_FRACTION", "Bounds", "encode_tabular", "load_split", "read_csv_gz", "tabular_feature_names"]

Bounds = tuple[float, float, bool]
"""A numeric column's fixed public (low, high, log scale)."""

TRAIN_FRACTION = 0.7
"""The training share of the fixed public split."""


def read_csv_gz(name: str) -> list[dict[str, str]]:
    """The rows of vips/datasets/data/<name> (a gzipped CSV with a header row), as dicts of strings."""
    resource = resources.files("vips.datasets").joinpath("data").joinpath(name)
    with resource.open("rb") as raw:
        text = gzip.decompress(raw.read()).decode("utf-8")
    return list(csv.DictReader(io.StringIO(text)))


def load_split(
    name: str,
    encode: Callable[[list[dict[str, str]]], tuple[NDArray[np.float64], NDArray[np.float64]]],
    feature_names: list[str],
    split: Literal["train", "test"],
) -> TabularData:
    """The bundled CSV `name` encoded by `encode` (rows -> features, labels) and split 70/30 by a fixed
    public permutation (numpy's default_rng(0)): the first 70% of the permuted rows are "train"."""
    if split not in ("train", "test"):
        raise ValueError("split must be 'train' or 'test'")
    features, labels = encode(read_csv_gz(name))
    order = np.random.default_rng(0).permutation(labels.shape[0])
    cut = round(TRAIN_FRACTION * labels.shape[0])
    rows = order[:cut] if split == "train" else order[cut:]
    return TabularData(features[rows], labels[rows], feature_names)


def tabular_feature_names(
    numeric: Mapping[str, object], binary: Sequence[str], categorical: Mapping[str, Sequence[str]]
) -> list[str]:
    """Intercept, numeric columns, 0/1 columns, then one-hot levels, in the order of encode_tabular."""
    names = ["intercept", *numeric, *binary]
    for column, levels in categorical.items():
        names.extend(f"{column}={level}" for level in levels)
    return names


def encode_tabular(
    rows: list[dict[str, str]],
    numeric: Mapping[str, Bounds],
    binary: Sequence[str],
    categorical: Mapping[str, Sequence[str]],
    yes: str,
) -> NDArray[np.float64]:
    """x = [1, numeric, binary, one-hot] / sqrt(1 + #numeric + #binary + #categorical), so ||x|| <= 1:
    numeric columns clipped to [0, 1] by (x - low) / (high - low), on the log1p scale where marked (a blank
    reads 0); a 0/1 column is 1 where its value is `yes`; a level outside the listed ones is all zeros."""
    n = len(rows)
    blocks: list[NDArray[np.float64]] = [np.ones((n, 1))]
    for column, (low, high, log) in numeric.items():
        raw = np.array([float(row[column] or 0.0) for row in rows])
        if log:
            raw, low, high = np.log1p(np.maximum(raw, 0.0)), math.log1p(low), math.log1p(high)
        blocks.append(np.clip((raw - low) / (high - low), 0.0, 1.0)[:, None])
    blocks.append(np.array([[1.0 if row[column] == yes else 0.0 for column in binary] for row in rows]))
    for column, levels in categorical.items():
        lookup = {level: j for j, level in enumerate(levels)}
        block = np.zeros((n, len(levels)))
        for i, row in enumerate(rows):
            if row[column] in lookup:
                block[i, lookup[row[column]]] = 1.0
        blocks.append(block)
    divisor = math.sqrt(1 + len(numeric) + len(binary) + len(categorical)) * (1.0 + 1e-12)
    return np.hstack(blocks) / divisor
