"""The main job end to end on the embedded default (`make run`): everything a user would type.

Starts `vips up` (API + one Celery worker, SQLite and a file broker under ./var/demo), creates keys,
ingests UCI Adult's training split as the custodian, sets a budget (epsilon 1, delta 1e-5), submits a
VIPS-BLR job over HTTP as the analyst and follows its progress, downloads the posterior, evaluates it on
Adult's public test split, prints AUC and the epsilon spent and remaining, shows that a job that would
overspend is refused with 409, and shuts the service down.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from worker.datasets.adult import load_adult, write_tabular_csv

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

    def vips(
        self, *argv: str, key: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        env = self.env if key is None else {**self.env, "VIPS_API_KEY": key}
        done = subprocess.run(
            [sys.executable, "-m", "vips.cli", *argv], env=env, text=True, capture_output=True
        )
        if check and done.returncode != 0:
            raise SystemExit(f"`vips {' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def step(self, text: str) -> None:
        print(f"\n== {text}", flush=True)


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"vips up exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("vips up did not become ready within a minute")


def run(home: Path, iterations: int) -> dict[str, Any]:
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    demo = Demo(home, free_port())
    started = time.monotonic()
    demo.step(f"vips up (embedded: SQLite + file broker under {home})")
    up_log = (home / "up.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "vips.cli", "up", "--port", demo.url.rsplit(":", 1)[1]],
        env=demo.env,
        stdout=up_log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_ready(demo.url, server)
        print(f"API ready at {demo.url} after {time.monotonic() - started:.1f} s")

        demo.step("keys: admin creates a custodian key and an analyst key, both for 'adult'")
        custodian = demo.vips(
            "admin", "create-key", "--role", "custodian", "--dataset", "adult"
        ).stdout.strip()
        analyst = demo.vips("admin", "create-key", "--role", "analyst", "--dataset", "adult").stdout.strip()

        demo.step("custodian: ingest UCI Adult train (public preprocessing, rows scaled to norm <= 1)")
        train_csv, test_csv = home / "adult_train.csv", home / "adult_test.csv"
        write_tabular_csv(load_adult("train"), train_csv)
        write_tabular_csv(load_adult("test"), test_csv)
        print(
            demo.vips(
                "data", "ingest", "adult", "--kind", "tabular", "--input", str(train_csv), "--label", "label"
            ).stdout.strip()
        )
        print(
            demo.vips(
                "budget",
                "set",
                "adult",
                "--epsilon",
                str(BUDGET_EPSILON),
                "--delta",
                str(DELTA),
                key=custodian,
            ).stdout.strip()
        )

        demo.step(f"analyst: VIPS-BLR over HTTP, batch mode, T = {iterations}, epsilon {JOB_EPSILON}")
        posterior = home / "posterior.json"
        fit = subprocess.run(
            [
                sys.executable,
                "-m",
                "vips.cli",
                "fit",
                "--dataset",
                "adult",
                "--model",
                "blr",
                "--iterations",
                str(iterations),
                "--epsilon",
                str(JOB_EPSILON),
                "--wait",
                "-o",
                str(posterior),
            ],
            env={**demo.env, "VIPS_API_KEY": analyst},
            stdout=subprocess.PIPE,
            text=True,
        )
        if fit.returncode != 0:
            raise SystemExit(f"the job failed: {fit.stdout.strip()}")
        job = json.loads(fit.stdout.strip().splitlines()[-1])

        demo.step("client side: evaluate the downloaded posterior on Adult test (public)")
        metrics = json.loads(
            demo.vips(
                "evaluate", "--posterior", str(posterior), "--input", str(test_csv), "--label", "label"
            ).stdout
        )
        budget = json.loads(demo.vips("budget", "show", "adult", key=custodian).stdout)["budget"]

        demo.step(f"a second job asking for epsilon {JOB_EPSILON} would overspend: refused")
        refused = demo.vips(
            "fit",
            "--dataset",
            "adult",
            "--model",
            "blr",
            "--iterations",
            str(iterations),
            "--epsilon",
            str(JOB_EPSILON),
            key=analyst,
            check=False,
        )
        if refused.returncode == 0 or "409" not in refused.stderr:
            raise SystemExit(f"the overspending job was not refused with 409: {refused.stderr.strip()}")
        print(refused.stderr.strip())
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
    args = parser.parse_args()
    run(args.home.resolve(), args.iterations)


if __name__ == "__main__":
    main()
