"""The models' catalog (vips.models.catalog) against their folders: a model is one folder with its facts
(spec.py), its public half (model.py) and its setup (setup.py), and the catalog lists every such folder
(docs/adding-a-model.md)."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

import vips.models
from vips.models.catalog import ALGORITHM_MODELS, KINDS, MODEL_ALIASES, MODELS
from vips.models.spec import ALGORITHMS, COMMON_OPTIONS

FOLDERS = sorted(
    path.name for path in Path(vips.models.__file__).parent.iterdir() if (path / "spec.py").is_file()
)


def test_the_catalog_lists_every_model_folder_under_its_own_name() -> None:
    assert sorted(MODELS) == FOLDERS
    for name, spec in MODELS.items():
        assert spec.name == name
        assert importlib.import_module(f"vips.models.{name}.spec").SPEC is spec


@pytest.mark.parametrize("name", FOLDERS)
def test_each_folder_has_its_public_half_and_a_setup_for_every_algorithm_that_fits_it(name: str) -> None:
    setup = importlib.import_module(f"vips.models.{name}.setup").setup
    assert list(inspect.signature(setup).parameters) == ["options", "algorithm", "vocabulary", "columns"]
    importlib.import_module(f"vips.models.{name}.model")
    spec = MODELS[name]
    assert set(spec.algorithms) <= set(ALGORITHMS) - {"vips"}
    assert set(spec.rules) == set(spec.fitted_by()) == set(spec.footprints)  # a rule and a footprint each
    for algorithm in spec.fitted_by():
        own = spec.options if algorithm == "vips" else spec.algorithms[algorithm]
        assert spec.option_specs(algorithm) == {**COMMON_OPTIONS, **own}
        assert name in ALGORITHM_MODELS[algorithm]


def test_kinds_and_aliases_come_from_the_specs() -> None:
    assert tuple(dict.fromkeys(spec.kind for spec in MODELS.values())) == KINDS
    for alias, (name, title) in MODEL_ALIASES.items():
        assert alias in MODELS[name].aliases and title == MODELS[name].title
        assert alias not in MODELS  # an alias never shadows a model's own name
