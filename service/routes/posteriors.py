"""Posteriors of finished jobs: the owning analyst, clients (within their scope), the custodian of the
job's dataset and admins."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from control.schemas import Message, Posterior
from service.http.auth import AUTH_RESPONSES, JobReaderKey
from service.http.deps import EngineDep
from service.http.params import JobIdPath
from service.routes.job_outputs import posterior_response
from service.routes.job_reads import visible_job

router = APIRouter(prefix="/jobs", tags=["posteriors"], responses=AUTH_RESPONSES)


@router.get(
    "/{job_id}/posterior",
    response_model=Posterior,
    responses={
        404: {"model": Message},
        409: {"model": Message, "description": "the job has not succeeded"},
        410: {"model": Message, "description": "the job's outputs were deleted"},
    },
)
def posterior(job_id: JobIdPath, engine: EngineDep, principal: JobReaderKey) -> Response:
    """The released posterior document, once the job has succeeded: one schema per model family
    (docs/posterior-format.md). Sent as stored, byte for byte, every float as the worker wrote it: streamed
    a chunk at a time with its Content-Length (never parsed, never whole in the API's memory)."""
    return posterior_response(engine, visible_job(engine, principal, job_id))
