"""The CLI's error types: each carries the exit code `main` returns (2 usage or input, 1 runtime)."""

from __future__ import annotations


class CliError(Exception):
    """An error reported as one line `vips: error: ...` on stderr, without a traceback."""

    exit_code = 1


class UsageError(CliError):
    """Bad arguments or bad input files (exit 2)."""

    exit_code = 2


class NotAvailable(UsageError):
    """A documented verb, kind, model or algorithm that this version does not implement yet (exit 2)."""


class RuntimeFailure(CliError):
    """The request was valid but could not be carried out (exit 1)."""

    exit_code = 1
