"""The bundled CSV datasets' common loading (worker/datasets/data): a gzipped CSV with a header row, read
into dicts, and the fixed public 70% / 30% split of a dataset without an official test split (a
permutation by seed 0, whatever the rows)."""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Callable
from importlib import resources
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from worker.datasets.adult import TabularData

__all__ = ["TRAIN_FRACTION", "load_split", "read_csv_gz"]

TRAIN_FRACTION = 0.7
"""The training share of the fixed public split."""


def read_csv_gz(name: str) -> list[dict[str, str]]:
    """The rows of worker/datasets/data/<name> (a gzipped CSV with a header row), as dicts of strings."""
    resource = resources.files("worker.datasets").joinpath("data").joinpath(name)
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
