"""The `vips` command line (docs/design.md section 6): the dispatch to vips.commands (parsers: vips.parsers).

Errors are one line `vips: error: ...` on stderr, exit 2 for usage or input errors and 1 for runtime
failures; no traceback (set VIPS_DEBUG=1 to get one for unexpected errors). Messages never carry data
values of the input: the readers and the store name lines, columns and rows only.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import signal
import sys
from collections.abc import Callable

from privacy_wall.names import NAME_RULE, is_dataset_name
from vips.errors import CliError, UsageError
from vips.parsers.admin import add_admin_data
from vips.parsers.base import Parser
from vips.parsers.fit import add_fit
from vips.parsers.predict import add_predict_evaluate
from vips.parsers.privacy import add_privacy
from vips.parsers.remote import add_client
from vips.parsers.server import add_server

Handler = Callable[[argparse.Namespace], int]


def package_version() -> str:
    """The installed version of the vips-service distribution ("unknown" when run from a bare tree)."""
    from importlib import metadata  # ~30 ms with its email parser: only for --version

    try:
        return metadata.version("vips-service")
    except metadata.PackageNotFoundError:
        return "unknown"


class _VersionAction(argparse.Action):
    """--version, looked up only when asked for (argparse's own needs the text when the parser is built)."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(f"vips {package_version()}")
        parser.exit()


def build_parser() -> Parser:
    parser = Parser(prog="vips", description="Variational Bayes in private settings.")
    parser.add_argument("--version", action=_VersionAction, help="show the installed version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_server(commands)
    add_admin_data(commands)
    add_client(commands)
    add_privacy(commands)
    add_fit(commands)
    add_predict_evaluate(commands)
    return parser


# Errors whose messages are written for users and carry no data values: usage or input errors (exit 2),
# and a refused budget (exit 1). Named by module so that a verb that never loads a module pays nothing for
# it: an exception of a class can only be raised once its module is loaded.
_INPUT_ERRORS = (
    ("privacy_wall.data.formats", "FormatError"),
    ("vips.posterior", "PosteriorError"),
    ("privacy_wall.data.store", "BoundViolation"),
    ("privacy_wall.accounting.calibration", "CalibrationError"),
    ("privacy_wall.gate", "PrivacyError"),
)
_BUDGET_ERRORS = (("privacy_wall.ledger.base", "BudgetExceeded"),)


def _is_one_of(exc: Exception, classes: tuple[tuple[str, str], ...]) -> bool:
    return any(
        module in sys.modules and isinstance(exc, getattr(sys.modules[module], name))
        for module, name in classes
    )


def _handler(target: str, *, settle: bool = False) -> Handler:
    """The handler "module:function" of vips.commands, imported only when its verb runs. `settle` (a process
    of one client-side verb, see _skip_the_final_collection): what the import creates (numpy's and scipy's
    ~10^5 objects, alive until exit) goes to the collector's permanent generation instead of through ~100
    collections that free nothing (~15 ms of a `vips fit --local`)."""
    module, _, function = target.partition(":")
    collecting = settle and gc.isenabled()
    if collecting:
        gc.disable()
    try:
        handler: Handler = getattr(importlib.import_module(f"vips.commands.{module}"), function)
    finally:
        if collecting:
            gc.freeze()
            gc.enable()
    return handler


#: The modules of vips.commands whose verbs act on this machine's store (migrate, data ingest, admin, up,
#: serve, worker, beat). They run under umask 077, so that whatever they create (VIPS_HOME, the SQLite files,
#: logs, the file broker) is private to its owner; client-side verbs keep the user's umask for the files
#: they write for the user (posteriors, predictions). The custodian's own verbs that write sensitive rows
#: to a file run under it too, so the file comes out 0600: prepare_text (`data prepare-text`, the counts of
#: sensitive texts) and scale (`vips scale -o`, the scaled rows).
_SERVER_SIDE = ("server", "admin", "prepare_text", "scale")


def _client_side(target: str) -> bool:
    return target.partition(":")[0] not in _SERVER_SIDE


def _run(target: str, args: argparse.Namespace, *, settle: bool = False) -> int:
    """Run the verb's handler; a server-side verb under umask 077 (restored after, for in-process callers)."""
    handler = _handler(target, settle=settle)
    if target.partition(":")[0] not in _SERVER_SIDE:
        return handler(args)
    previous = os.umask(0o077)
    try:
        return handler(args)
    finally:
        os.umask(previous)


def _fail(message: str, code: int) -> int:
    print(f"vips: error: {message}", file=sys.stderr)
    return code


def _check_names(args: argparse.Namespace) -> None:
    """Every verb that takes a dataset name (ingest NAME, budget set/show NAME, create-key --dataset,
    fit --dataset) takes it under the one rule the server enforces (privacy_wall.names)."""
    for attribute, label in (("name", "NAME"), ("dataset", "--dataset")):
        value = getattr(args, attribute, None)
        if value is not None and not is_dataset_name(value):
            raise UsageError(f"argument {label}: {NAME_RULE}")


def _skip_the_final_collection() -> None:
    """Leave every object to the operating system when this process exits: the interpreter's last garbage
    collection walks all of them (scipy alone brings ~10^5) and took ~0.2 s of a one-second `vips fit
    --local`. Files, atexit handlers and weakref finalizers (temporary directories) still run; only
    objects in reference cycles are not finalized. For processes of one client-side verb only (main()
    with argv None): an in-process caller (tests) keeps its collector, server verbs are left as they are."""
    gc.freeze()


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush does not fail on the closed pipe again
    (the Python docs' recipe for SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: list[str] | None = None) -> int:
    args: argparse.Namespace | None = None
    try:
        args = build_parser().parse_args(argv)
        _check_names(args)
        return _run(args.handler, args, settle=argv is None and _client_side(args.handler))
    except SystemExit as exc:  # --help and --version exit through argparse
        return exc.code if isinstance(exc.code, int) else 0
    except CliError as exc:
        return _fail(str(exc), exc.exit_code)
    except BrokenPipeError:  # `vips jobs | head -1`: the reader has what it wanted; end quietly as cat does
        _silence_stdout()
        return 128 + signal.SIGPIPE
    except Exception as exc:
        if _is_one_of(exc, _INPUT_ERRORS):
            return _fail(str(exc), 2)
        if _is_one_of(exc, _BUDGET_ERRORS):
            return _fail(str(exc), 1)
        # The message of an unexpected error might quote data: name its type only.
        if os.environ.get("VIPS_DEBUG"):
            raise
        return _fail(f"internal error ({type(exc).__name__}); set VIPS_DEBUG=1 for a traceback", 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    finally:
        if argv is None and args is not None and _client_side(args.handler):
            _skip_the_final_collection()


if __name__ == "__main__":
    sys.exit(main())
