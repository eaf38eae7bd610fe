"""The main job end to end on the embedded default (`make run`): everything a user would type.

Starts `vips up` (API + one Celery worker, SQLite and a file broker under ./var/demo), creates keys,
ingests UCI Adult's training split as the custodian, sets a budget (epsilon 1, delta 1e-5), submits a
VIPS-BLR job over HTTP as the analyst and follows its progress, downloads the posterior, evaluates it on
Adult's public test split, prints AUC and the epsilon spent and remaining, shows that a job that would
overspend is refused with 409, and shuts the service down (with --keep it stays up for you to explore).
Every command is echoed as you would type it, keys by the variable that holds them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from vips.datasets.adult import load_adult, write_tabular_csv

JOB_EPSILON = 0.9
BUDGET_EPSILON = 1.0
DELTA = 1e-5


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Demo:
    def __init__(self, home: Path, port: int) -> None:
        self.home = home
        self.url = f"http://127.0.0.1:{port}"
        self.env = {**os.environ, "VIPS_HOME": str(home), "VIPS_URL": self.url}
        for name in ("VIPS_BROKER_URL", "VIPS_CONTROL_DATABASE_URL", "VIPS_SENSITIVE_DATABASE_URL"):
            self.env.pop(name, None)
        #: the keys made so far, by the shell variable the echoed commands name them with
        self.keys: dict[str, str] = {}

    def echo(self, argv: tuple[str, ...], key: str | None = None) -> None:
        """The command as a user would type it (VIPS_HOME and VIPS_URL exported as printed at start)."""
        prefix = "" if key is None else f"VIPS_API_KEY=${key} "
        print(f"$ {prefix}vips {shlex.join(argv)}", flush=True)

    def vips(
        self, *argv: str, key: str | None = None, check: bool = True, capture: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run `vips argv` as the holder of the key named `key` (e.g. "ANALYST_KEY"), echoing it first;
        without `capture` its stderr (progress, notes) goes to the terminal."""
        self.echo(argv, key)
        env = self.env if key is None else {**self.env, "VIPS_API_KEY": self.keys[key]}
        done = subprocess.run(
            [sys.executable, "-m", "vips.cli", *argv],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if capture else None,
        )
        if check and done.returncode != 0:
            raise SystemExit(f"`vips {shlex.join(argv)}` failed ({done.returncode}): {done.stderr or ''}")
        return done

    def create_key(self, variable: str, role: str, dataset: str) -> None:
        key = self.vips("admin", "create-key", "--role", role, "--dataset", dataset).stdout.strip()
        self.keys[variable] = key
        print(f"  ({variable}={key[:13]}...)")

    def step(self, text: str) -> None:
        print(f"\n== {text}", flush=True)


def wait_ready(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    """Until `vips up` answers /readyz; if it exits first, stop with the end of its log (why it exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise SystemExit(
                "\n".join([f"vips up exited with {process.returncode}; the end of {log}:", *tail])
            )
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("vips up did not become ready within a minute")


def _explore(demo: Demo, server: subprocess.Popen[bytes]) -> None:
    """--keep: the service stays up; print what another shell needs, wait for Ctrl-C."""
    demo.step("the service stays up (--keep); from another shell:")
    print(f"export VIPS_HOME={shlex.quote(str(demo.home))} VIPS_URL={demo.url}")
    for variable, key in demo.keys.items():
        print(f"export {variable}={key}")
    print("VIPS_API_KEY=$ANALYST_KEY vips jobs      # and vips job ID, vips ledger adult (custodian), ...")
    print(f"open {demo.url}/ui and sign in with $CUSTODIAN_KEY or $ANALYST_KEY: the dashboard")
    print(f"open {demo.url}/docs for the API; Ctrl-C here stops the service")
    with contextlib.suppress(KeyboardInterrupt):
        server.wait()


def make_home(home: Path) -> None:
    """Create `home` and any missing parent (./var) private to the owner: `vips up` refuses a store others
    can read, including the README's own VIPS_HOME=$PWD/var that the demo's parent becomes."""
    previous = os.umask(0o077)
    try:
        home.mkdir(parents=True)
    finally:
        os.umask(previous)


def run(home: Path, iterations: int, keep: bool = False) -> dict[str, Any]:
    shutil.rmtree(home, ignore_errors=True)
    make_home(home)
    demo = Demo(home, free_port())
    started = time.monotonic()
    demo.step(f"vips up: the embedded service (SQLite + a file broker under {home}); its log {home}/up.log")
    print(
        f"  ({home} is the demo's own store, emptied at every `make run`; your own `vips up` keeps its "
        "store in ./var, the README's VIPS_HOME=$PWD/var, which the demo never touches)"
    )
    print(f"$ export VIPS_HOME={shlex.quote(str(home))} VIPS_URL={demo.url}")
    port = demo.url.rsplit(":", 1)[1]
    demo.echo(("up", "--port", port))
    up_log = (home / "up.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "vips.cli", "up", "--port", port],
        env=demo.env,
        stdout=up_log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_ready(demo.url, server, home / "up.log")
        print(f"API ready at {demo.url} after {time.monotonic() - started:.1f} s (docs at {demo.url}/docs)")

        demo.step("admin (server side): a custodian key and an analyst key, both for dataset 'adult'")
        demo.create_key("CUSTODIAN_KEY", "custodian", "adult")
        demo.create_key("ANALYST_KEY", "analyst", "adult")

        demo.step("custodian: ingest UCI Adult train (public preprocessing, rows scaled to norm <= 1)")
        train_csv, test_csv = home / "adult_train.csv", home / "adult_test.csv"
        write_tabular_csv(load_adult("train"), train_csv)
        write_tabular_csv(load_adult("test"), test_csv)
        print(f"  (wrote {train_csv} and {test_csv} from the bundled UCI Adult)")
        ingest_argv = ("data", "ingest", "adult", "--kind", "tabular", "--input", str(train_csv))
        print(demo.vips(*ingest_argv).stdout.strip())
        budget_argv = ("budget", "set", "adult", "--epsilon", str(BUDGET_EPSILON), "--delta", str(DELTA))
        print(demo.vips(*budget_argv, key="CUSTODIAN_KEY").stdout.strip())

        demo.step(f"analyst: VIPS-BLR over HTTP, batch mode, T = {iterations}, epsilon {JOB_EPSILON}")
        posterior = home / "posterior.json"
        schedule = ("--iterations", str(iterations), "--epsilon", str(JOB_EPSILON))
        fit_argv = ("fit", "--dataset", "adult", "--model", "blr", *schedule)
        fit = demo.vips(*fit_argv, "--wait", "-o", str(posterior), key="ANALYST_KEY", capture=False)
        job = json.loads(fit.stdout.strip().splitlines()[-1])

        demo.step("client side: evaluate the downloaded posterior on Adult test (public)")
        evaluate_argv = ("evaluate", "--posterior", str(posterior), "--input", str(test_csv))
        metrics = json.loads(demo.vips(*evaluate_argv).stdout)
        print(json.dumps(metrics))
        budget = json.loads(demo.vips("budget", "show", "adult", key="CUSTODIAN_KEY").stdout)["budget"]
        print(json.dumps(budget))

        demo.step(f"a second job asking for epsilon {JOB_EPSILON} would overspend: refused")
        refused = demo.vips(*fit_argv, key="ANALYST_KEY", check=False)
        if refused.returncode == 0 or "409" not in refused.stderr:
            raise SystemExit(f"the overspending job was not refused with 409: {refused.stderr.strip()}")
        print(refused.stderr.strip())
        if keep:
            _explore(demo, server)
    finally:
        demo.step("shutting down")
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        up_log.close()
    summary = {
        "test_auc": round(metrics["auc"], 4),
        "test_accuracy": round(metrics["accuracy"], 4),
        "sigma": job["sigma"],
        "epsilon_spent": budget["epsilon_spent"],
        "epsilon_remaining": budget["epsilon_remaining"],
        "delta": budget["delta"],
        "second_job": "refused with 409",
        "seconds": round(time.monotonic() - started, 1),
    }
    print("\n" + json.dumps(summary, indent=2))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--home", type=Path, default=Path("var/demo"))
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--keep", action="store_true", help="leave the service up afterwards (Ctrl-C stops)")
    args = parser.parse_args()
    run(args.home.resolve(), args.iterations, args.keep)


if __name__ == "__main__":
    main()
