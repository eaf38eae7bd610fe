"""A bounded schemathesis run over the whole OpenAPI schema, in process: no input is a server error.

Every operation is fuzzed with an admin, an analyst and a custodian key, with valid (positive) and invalid
(negative) inputs generated from the schema, and with the path pointing at a real dataset and a real job
as well as at generated ones. The `not_a_server_error` check must pass on every response.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from control.jobs.queue import RecordingQueue
from control.settings import ServiceSettings
from privacy_wall.sqlengine import create_db_engine
from service.app import create_app
from tests.dbservers import fresh_database
from tests.test_api import MAX_ITERATIONS, populate

pytestmark = pytest.mark.slow

#: Examples per operation, key and generation mode (16 operations x 3 keys x 2 modes): 15 keeps the suite
#: within its time budget; VIPS_FUZZ_EXAMPLES=200 gives a longer run.
EXAMPLES = int(os.environ.get("VIPS_FUZZ_EXAMPLES", "15"))
ROLES = ("admin", "analyst", "cust")


@pytest.fixture
def fuzzed(tmp_path: Path) -> Iterator[tuple[FastAPI, dict[str, str]]]:
    with fresh_database("sqlite", tmp_path, "control") as url:
        engine = create_db_engine(url)
        keys, _ = populate(engine)
        settings = ServiceSettings(
            home=tmp_path, control_database_url=url, max_iterations=MAX_ITERATIONS, reaper_interval_seconds=0
        )
        try:
            yield create_app(settings, queue=RecordingQueue()), keys
        finally:
            engine.dispose()


def _fuzz(cases: st.SearchStrategy[Any], headers: dict[str, str], failures: list[str]) -> int:
    """Run up to 2 x EXAMPLES generated cases; record the server errors. Returns the number run."""
    count = 0

    @settings(
        max_examples=EXAMPLES * 2,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases)
    def run(case: Any) -> None:
        nonlocal count
        count += 1
        response = case.call(headers=headers)
        try:
            case.validate_response(response, checks=[not_a_server_error])
        except Exception:
            failures.append(
                f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:200]}"
            )

    run()
    return count


def test_no_input_is_a_server_error(fuzzed: tuple[FastAPI, dict[str, str]]) -> None:
    app, keys = fuzzed
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 14

    # A real job, so the job routes are exercised beyond their 404s.
    submit = next(op for op in operations if op.method == "post" and op.path == "/v1/jobs")
    case = submit.Case(
        body={"dataset": "priv", "model": "blr", "iterations": 2, "batch_size": 100, "sigma": 2}
    )
    created = case.call(headers={"Authorization": f"Bearer {keys['analyst']}"})
    assert created.status_code == 202, created.text
    job_id = created.json()["id"]

    examples = 0
    failures: list[str] = []
    for operation in operations:
        names = {p.name for p in operation.path_parameters}
        pinned: dict[str, Any] = {}
        if "name" in names:
            pinned["name"] = "priv"
        if "job_id" in names:
            pinned["job_id"] = job_id
        strategies = []
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategies.append(operation.as_strategy(mode))
            if pinned and mode is GenerationMode.POSITIVE:
                strategies.append(operation.as_strategy(mode, path_parameters=pinned))
        for role in ROLES:
            examples += _fuzz(st.one_of(strategies), {"Authorization": f"Bearer {keys[role]}"}, failures)
    assert examples >= len(operations) * len(ROLES) * EXAMPLES, examples
    print(f"schemathesis: {examples} examples, {len(failures)} server errors")
    assert not failures, failures[:20]
