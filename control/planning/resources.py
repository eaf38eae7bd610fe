"""What a job will cost the worker and the control database, estimated before admission (issue 21).

From the dataset's public shape (kind, rows N, dimension d / vocabulary V / pixels J, as the `datasets`
row holds them) and the spec (batch size S, iterations T, model options), each model's formula (its
spec's `footprints`, vips/models/<model>/spec.py) counts three numbers of float64 values, read off the
model's code (vips.models.*) and its wall query (privacy_wall.queries.*):

- working: the numpy arrays alive at the job's busiest moment (E-step, M-step, noise, post-processing);
- release: the values of one stored release (the post-processed statistics the gate returns);
- posterior: the values of the posterior document stored at the end.

The estimates (`estimate`) are then
  memory_bytes  = WORKER_BASE_BYTES + 8 working + max(RELEASE_SERIALISED_BYTES release,
                                                      POSTERIOR_SERIALISED_BYTES posterior)
  release_bytes = 8 release + RELEASE_OVERHEAD_BYTES
  stored_bytes  = T release_bytes + POSTERIOR_BYTES_PER_VALUE posterior
A release is stored as .npz (control.store.release_arrays: 8 bytes per float64, deflated only where that
shrinks it, plus headers); the posterior document is JSON (docs/posterior-format.md). The serialisation terms
count what storing a document costs on top of its arrays. tests/control/planning/test_resources.py checks the
estimates against peaks measured with tracemalloc.
"""

from __future__ import annotations

from dataclasses import dataclass

from control.errors import Loc
from control.jobs.storage import human_bytes
from vips.models.catalog import MODELS
from vips.models.spec import Footprint

#: A stored release: 8 bytes per float64 (.npz, deflated only where a sample shrinks to 3/4:
#: control.store.release_arrays), plus 216 bytes per block (its .npy header and zip entries; up to 7 blocks)
#: and the zip's 22-byte end record.
RELEASE_BYTES_PER_VALUE = 8
RELEASE_OVERHEAD_BYTES = 7 * 216 + 22
#: Storing a release: the .npz in its growing buffer, its final copy and the database driver's copy.
RELEASE_SERIALISED_BYTES = 4 * RELEASE_BYTES_PER_VALUE
#: Bytes one float64 of the posterior's JSON takes (repr of up to 17 significant digits, sign, exponent,
#: ", ").
POSTERIOR_BYTES_PER_VALUE = 24
#: A float in a list from ndarray.tolist(): a 24-byte float object and an 8-byte list slot.
PYTHON_FLOAT_BYTES = 32
#: Storing the posterior: its Python lists, its JSON text and the database driver's copy of the text.
POSTERIOR_SERIALISED_BYTES = PYTHON_FLOAT_BYTES + 2 * POSTERIOR_BYTES_PER_VALUE
#: A worker process before any job: the interpreter, numpy, scipy, SQLAlchemy and Celery.
WORKER_BASE_BYTES = 256 << 20
FLOAT_BYTES = 8


@dataclass(frozen=True)
class Resources:
    memory_bytes: int
    release_bytes: int
    stored_bytes: int
    driver: Loc
    why: str


def footprint(
    model: str, algorithm: str, options: dict[str, float], dimension: int, batch_size: int
) -> Footprint:
    """The footprint of a checked spec (model, algorithm and options already valid): the model's own
    formula for the algorithm (its spec's `footprints`)."""
    return MODELS[model].footprints[algorithm](options, int(dimension), int(batch_size))


def estimate(
    model: str, algorithm: str, options: dict[str, float], dimension: int, batch_size: int, iterations: int
) -> Resources:
    """memory, release and stored bytes of a job (module docstring)."""
    f = footprint(model, algorithm, options, dimension, batch_size)
    serialised = max(RELEASE_SERIALISED_BYTES * f.release, POSTERIOR_SERIALISED_BYTES * f.posterior)
    release = RELEASE_BYTES_PER_VALUE * f.release + RELEASE_OVERHEAD_BYTES
    return Resources(
        memory_bytes=WORKER_BASE_BYTES + FLOAT_BYTES * f.working + serialised,
        release_bytes=release,
        stored_bytes=iterations * release + POSTERIOR_BYTES_PER_VALUE * f.posterior,
        driver=f.driver,
        why=f.why,
    )


def resource_errors(
    resources: Resources,
    iterations: int,
    *,
    max_memory_mb: float,
    max_release_mb: float,
    max_stored_mb: float,
) -> list[tuple[Loc, str]]:
    """The limits `resources` exceeds, as SpecError entries naming the estimate and the limit."""
    mb = 1 << 20
    errors: list[tuple[Loc, str]] = []
    if resources.memory_bytes > max_memory_mb * mb:
        errors.append(
            (
                resources.driver,
                f"this job needs about {human_bytes(resources.memory_bytes)} of worker memory "
                f"({resources.why}); the server allows {human_bytes(max_memory_mb * mb)} "
                "(VIPS_MAX_JOB_MEMORY_MB)",
            )
        )
    if resources.release_bytes > max_release_mb * mb:
        errors.append(
            (
                resources.driver,
                f"each release of this job would store about {human_bytes(resources.release_bytes)} "
                f"({resources.why}); the server allows {human_bytes(max_release_mb * mb)} "
                "(VIPS_MAX_RELEASE_MB)",
            )
        )
    if resources.stored_bytes > max_stored_mb * mb:
        errors.append(
            (
                ("iterations",),
                f"this job would store about {human_bytes(resources.stored_bytes)} ({iterations} releases "
                f"of {human_bytes(resources.release_bytes)} and its posterior); the server allows "
                f"{human_bytes(max_stored_mb * mb)} (VIPS_MAX_JOB_STORED_MB)",
            )
        )
    return errors
