"""The states of a job. Imports nothing heavy, so the CLI's parser can offer them as choices."""

from __future__ import annotations

from typing import Literal, get_args

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
JOB_STATUSES: tuple[str, ...] = get_args(JobStatus)
#: The states a job never leaves.
TERMINAL: tuple[str, ...] = ("succeeded", "failed", "cancelled")
