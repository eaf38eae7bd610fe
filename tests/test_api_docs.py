"""The API's own documentation (issue 13.6): /docs and /redoc load only what the service serves, every
request example in the OpenAPI document is one the API accepts, and the typed posterior schemas describe
the documents the models really write. tests/test_ui_browser.py renders both pages in Chromium."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import schemathesis
import scipy.sparse as sp
from pydantic import TypeAdapter

from control.schemas import Posterior
from privacy_wall.accounting.events import SubsampledGaussianEvent
from privacy_wall.ledger import database as ledger_db
from privacy_wall.ledger.base import Charge
from tests.dbservers import fresh_database
from tests.test_api import Api, add_dataset, make_api
from vips.estimators import (
    DPSEPLinearRegression,
    DPSEPLogisticRegression,
    DPVILogisticRegression,
    VIPSLatentDirichletAllocation,
    VIPSLinearRegression,
    VIPSLogisticRegression,
    VIPSSigmoidBeliefNetwork,
)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with fresh_database("sqlite", tmp_path, "control") as url:
        yield from make_api(url, tmp_path)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_pages_load_only_what_the_service_serves(api: Api, page: str) -> None:
    html = api.client.get(page)
    assert html.status_code == 200
    assert not re.findall(r"https?://", html.text), "the page names another host"
    loaded = re.findall(r'(?:src|href)="([^"]+)"', html.text)
    assert any(url.endswith(".js") for url in loaded)
    for url in loaded:
        assert url.startswith("/"), url
        asset = api.client.get(url)
        assert asset.status_code == 200, url
        # what the scripts themselves would fetch (issue 24.8: ReDoc's sidebar logo from cdn.redoc.ly)
        assert not re.findall(r'src\s*[:=]\s*["\']https?://|url\(\s*["\']?https?://', asset.text), url
    assert "fonts.googleapis" not in html.text and "cdn.jsdelivr" not in html.text


def _examples(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(method, path, example body) for every operation whose request body has examples."""
    schemas = spec["components"]["schemas"]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if body is None:
                continue
            schema = body["schema"]
            if "$ref" in schema:
                schema = schemas[schema["$ref"].rsplit("/", 1)[1]]
            assert schema.get("examples"), f"{method.upper()} {path} has no request example"
            for example in schema["examples"]:
                yield method, path, example


def test_every_request_example_is_accepted(api: Api) -> None:
    """Swagger's "Try it out" fills in these bodies: each must be a request the API accepts."""
    add_dataset(api.engine, "adult", population=32_561)
    ledger_db.set_budget(api.engine, "adult", 100.0, 1e-5)
    ledger_db.set_budget(api.engine, "docs", 100.0, 1e-5)  # the LDA example's: the fixture's bag of words
    who = {
        "/v1/keys": "admin",
        "/v1/jobs": "analyst",
        "/v1/datasets/{name}/budget": "admin",
        "/v1/datasets/{name}/quotas/{key_id}": "admin",
    }
    tried = 0
    for method, path, example in _examples(api.client.app.openapi()):  # type: ignore[attr-defined]
        url = path.replace("{name}", "nobudget")  # a dataset the job examples do not need
        url = url.replace("{key_id}", api.ids["analyst"])  # an analyst key on every dataset
        r = api.call(method.upper(), url, who[path], json=example)
        assert r.status_code < 300, (method, path, example, r.text)
        tried += 1
    assert tried >= 8  # keys 3, budget 1, jobs 4


@pytest.mark.slow
def test_an_unbounded_spend_is_null_and_the_answers_validate_against_the_openapi_schema(api: Api) -> None:
    """A sigma-0 job on a public dataset spends an unbounded epsilon. JSON has no infinity, so the answers
    say null, and the schema says so (number or null; issue 34.11): every answer that carries the spend
    validates against the OpenAPI document the service serves."""
    job = api.submit(dataset="pub", sigma=0, batch_size=20, iterations=2).json()["id"]
    ledger_db.commit_charge(api.engine, Charge("pub", job, 1, SubsampledGaussianEvent(0.0, 20, 200)))
    schema = schemathesis.openapi.from_dict(api.client.get("/openapi.json").json())
    uncapped = {"epsilon": None, "delta": 1e-5}  # a public dataset takes no cap (PUT refuses one: 422)
    answers = {
        ("GET", "/v1/datasets/{name}"): api.call("GET", "/v1/datasets/pub", "admin"),
        ("GET", "/v1/datasets"): api.call("GET", "/v1/datasets", "admin"),
        ("GET", "/v1/datasets/{name}/ledger"): api.call("GET", "/v1/datasets/pub/ledger", "admin"),
        ("GET", "/v1/jobs/{job_id}"): api.call("GET", f"/v1/jobs/{job}", "analyst"),
        ("POST", "/v1/jobs"): api.submit(dataset="pub", sigma=1.0, batch_size=20, dry_run=True),
        ("PUT", "/v1/datasets/{name}/budget"): api.call(
            "PUT", "/v1/datasets/pub/budget", "admin", json=uncapped
        ),
    }
    # A cap set on the public dataset before PUT refused one stays in the ledger (as a budget from before
    # the delta policy does): the 409 it gives carries the unbounded spend too.
    ledger_db.set_budget(api.engine, "pub", 5.0, 1e-5)
    refused = api.submit(dataset="pub", sigma=1.0, batch_size=20)  # the old cap is below the spend
    for (method, path), answer in [*answers.items(), (("POST", "/v1/jobs"), refused)]:
        assert answer.status_code in (200, 409), (method, path, answer.text)
        schema[path][method].validate_response(answer)
    budget = answers["GET", "/v1/datasets/{name}"].json()["budget"]
    assert budget["epsilon_spent"] is None and budget["epsilon_reserved"] is None
    quote = answers["POST", "/v1/jobs"].json()
    assert quote["epsilon_spent"] is None and quote["epsilon_reserved"] is None
    assert answers["PUT", "/v1/datasets/{name}/budget"].json()["epsilon_spent"] is None
    assert refused.status_code == 409 and refused.json()["epsilon_spent_or_reserved"] is None
    described = schema.raw_schema["components"]["schemas"]["BudgetPublic"]["properties"]["epsilon_spent"]
    assert "null when unbounded" in described["description"]


def _fits() -> Iterator[tuple[str, dict[str, Any]]]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3))
    x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
    labels = (x[:, 0] > 0).astype(int)
    quiet: dict[str, Any] = {"sigma": 0, "random_state": 0, "iterations": 2}
    for estimator in (VIPSLogisticRegression, DPVILogisticRegression, DPSEPLogisticRegression):
        yield estimator.__name__, estimator(**quiet).fit(x, labels).posterior_
    for regression in (VIPSLinearRegression, DPSEPLinearRegression):
        yield regression.__name__, regression(**quiet).fit(x, x[:, 0] / 2).posterior_
    counts = sp.csr_array(rng.poisson(1.0, size=(40, 15)))
    yield "lda", VIPSLatentDirichletAllocation(topics=3, doc_length=0, **quiet).fit(counts).posterior_
    fallback = VIPSLatentDirichletAllocation(topics=3, epsilon=1.0, iterations=2).fit(counts).posterior_
    assert "private_unigram" in fallback  # the rule's unigram fallback at this scale
    yield "lda with the unigram fallback", fallback
    images = (rng.random((60, 16)) > 0.5).astype(float)
    yield "sbn", VIPSSigmoidBeliefNetwork(hidden=2, **quiet).fit(images).posterior_


@pytest.mark.parametrize(("name", "document"), list(_fits()))
def test_the_typed_posterior_schemas_describe_real_documents(name: str, document: dict[str, Any]) -> None:
    parsed = TypeAdapter(Posterior).validate_python(document)
    assert parsed.model == document["model"]
    # nothing lost or changed: the typed view dumps back to the same document
    assert parsed.model_dump(by_alias=True, exclude_unset=True) == document
    # every top-level field is a typed one (none passes only as an extra the schema does not describe)
    assert not parsed.model_extra, sorted(parsed.model_extra or {})


def test_the_documented_example_is_a_valid_posterior() -> None:
    text = (Path(__file__).parents[1] / "docs" / "posterior-format.md").read_text()
    (example,) = re.findall(r"```json\n(.*?)```", text, re.DOTALL)
    document = json.loads(example)
    assert TypeAdapter(Posterior).validate_python(document).model == "blr"


def test_nothing_refers_to_a_file_outside_the_repository() -> None:
    """The design notes live in docs/: no file points at the shared folder beside the checkout."""
    root = Path(__file__).parents[1]
    skipped = {".venv", ".git", "build", "var", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
    outside = re.compile(r"\.\./" + "shared|" + r"\bDESIGN(\.md)?\b")
    offenders = []
    for folder, subfolders, files in os.walk(root):
        # Pruned before they are entered: another test may build a wheel (build/) while this one walks.
        subfolders[:] = [n for n in subfolders if n not in skipped and not n.endswith(".egg-info")]
        for path in (Path(folder) / name for name in files):
            offenders += _outside_references(root, path, outside)
    assert offenders == []


def _outside_references(root: Path, path: Path, outside: re.Pattern[str]) -> list[str]:
    """Lines of a text file of the repository (by its suffix or name) that point outside it."""
    if path.suffix in {".py", ".md", ".toml", ".yml", ".ini", ".html", ".css", ".txt"} or path.name in {
        "Makefile",
        "Dockerfile",
        "run",
    }:
        lines = enumerate(path.read_text().splitlines(), 1)
        return [f"{path.relative_to(root)}:{n}" for n, line in lines if outside.search(line)]
    return []


def test_the_contracts_names_are_the_models_facts() -> None:
    """The API's Literal types spell out the models, algorithms and kinds for the OpenAPI document; they
    must be the catalog's (vips.models.catalog), in its order (docs/adding-a-model.md)."""
    from typing import get_args

    from control import schemas
    from vips.models.catalog import KINDS, MODELS
    from vips.models.spec import ALGORITHMS

    assert get_args(schemas.Model) == tuple(MODELS) == schemas.AVAILABLE_MODELS
    assert get_args(schemas.Algorithm) == ALGORITHMS == schemas.AVAILABLE_ALGORITHMS
    assert get_args(schemas.DatasetKind) == KINDS
