"""VIPS-BLR accuracy study on Adult (issue 12, first pass): post-processing variants of the batch fit.

Setting: batch S = N, delta = 1e-5, sigma calibrated by the default (pld) accountant for each epsilon and
T. Every variant is post-processing of the same releases (or, for direction d, a simulation), so none
changes what is charged. Directions:

- (a) the noisy s2 in the M-step. The wall releases s2 already projected to PSD; the noise on the packed
  triangle has std sigma_2 = Release.noise_std["s2"] per entry, so the symmetric noise matrix is a Wigner
  matrix with spectral edge 2 sigma_2 sqrt(d). Variants on the released eigenvalues lambda:
  "soft k": max(lambda - k sigma_2 sqrt(d), 0) (removes the positive bias the projection leaves in the
  directions the noise dominates; soft thresholding commutes with the projection, so it equals shifting
  before it); "ridge k": s2 + k sigma_2 sqrt(d) I (the opposite: more of the projection's regularisation);
  "shrink": toward (tr s2 / d) I with weight min(1, d^2 sigma_2^2 / ||s2 - (tr s2 / d) I||_F^2) (the
  noise's share of the spread); "spike": the spiked-Wigner inverse
  theta = (lambda + sqrt(lambda^2 - 4 d sigma_2^2)) / 2 above the edge, 0 below (parameter-free).
- (b) weighting the releases: rho_t = 1/t (today), "burn k" (rho_t = 1/t up to t = k, then restart the
  average at t = k + 1: the first k releases, computed at the prior's moments, are dropped), "linear"
  (rho_t = 2/(t+1): weights proportional to t), "quadratic" (rho_t = 3/(t+2)), "kappa 0.7" (t^-0.7).
- (c) T in {5, 10, 20} (sigma recalibrated for each T at the same epsilon).
- (d) splitting the noise between s1 and s2 (simulation only: the wall has no such option, and it would
  need its own sensitivity proof). Blocks scaled by weights (1, r) before one Gaussian mechanism: by the
  vertex argument of privacy_wall/queries/blr.py the joint sensitivity becomes
  J_r^2 = max_c (1 + c)/2 + r^2 max(1 - c^2, 1/2) (J_1 = 5/4), and block noise stds sigma J_r Delta_1 and
  sigma J_r Delta_2 / r: same sigma, same charge. The releases are simulated in-process with the query's
  own clipped sums and post-processing (numpy's generator, not the gate: a bench simulation only).

Tuning: 3-fold cross-validation inside adult.data (train on two folds, validation AUC on the third), one
choice per direction and epsilon. Test AUC on adult.test only for today's fit and each direction's
choice (plus the choices combined), with independent repeats.

    python -m bench.blr_study [--quick] [--cv-repeats N] [--test-repeats N] [--out DIR]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from sklearn.metrics import roc_auc_score

from privacy_wall.accounting.calibration import calibrate_sigma
from privacy_wall.data.store import Batch, InMemoryTabularStore
from privacy_wall.gate import Gate
from privacy_wall.ledger.base import InMemoryLedger
from privacy_wall.queries.base import Array
from privacy_wall.queries.blr import JOINT_SENSITIVITY, LogisticRegressionQuery
from vips.datasets.adult import TabularData, load_adult
from vips.models.blr.model import BayesianLogisticRegression, BlrState, predict_proba

DELTA = 1e-5
EPSILONS: tuple[float, ...] = (0.3, 0.8, 2.0)
BASE_T = 10


@dataclass(frozen=True)
class Variant:
    """One way to run the batch fit: s2 treatment, step-size schedule, T and the s1:s2 noise weight r."""

    s2: str = "psd"  # "psd" | "soft <k>" | "ridge <k>" | "shrink" | "spike"
    schedule: str = "1/t"  # "1/t" | "burn <k>" | "linear" | "quadratic" | "kappa 0.7"
    iterations: int = BASE_T
    ratio: float = 1.0  # r: weight of s2 relative to s1 (simulated releases unless 1)
    aware: bool = False  # the noise-aware M-step (vips.models.blr.model, the default since issue 12)

    def label(self) -> str:
        parts = [f"s2 {self.s2}", f"rho {self.schedule}", f"T {self.iterations}"]
        if self.ratio != 1.0:
            parts.append(f"r {self.ratio:g}")
        if self.aware:
            parts.append("noise-aware")
        return ", ".join(parts)


BASELINE = Variant()
DIRECTIONS: dict[str, list[Variant]] = {
    "a: s2 treatment": [
        BASELINE,
        Variant(s2="soft 0.1"),
        Variant(s2="soft 0.5"),
        Variant(s2="ridge 0.1"),
        Variant(s2="ridge 0.5"),
        Variant(s2="shrink"),
        Variant(s2="spike"),
    ],
    "b: release weights": [
        BASELINE,
        Variant(schedule="burn 1"),
        Variant(schedule="burn 2"),
        Variant(schedule="linear"),
        Variant(schedule="quadratic"),
        Variant(schedule="kappa 0.7"),
    ],
    "c: iterations": [Variant(iterations=5), BASELINE, Variant(iterations=20)],
    "d: s1:s2 split (simulated)": [
        BASELINE,
        Variant(ratio=0.5),
        Variant(ratio=math.sqrt(2)),
        Variant(ratio=2.0),
        Variant(ratio=4.0),
    ],
    "e: noise-aware M-step (second pass)": [
        BASELINE,
        Variant(s2="ridge 0.1"),
        Variant(aware=True),
        Variant(aware=True, s2="ridge 0.05"),
        Variant(aware=True, s2="ridge 0.1"),
    ],
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def rho(schedule: str, t: int) -> float:
    if schedule == "1/t":
        return 1.0 / t
    if schedule.startswith("burn "):
        k = int(schedule.split()[1])
        return 1.0 / t if t <= k else 1.0 / (t - k)
    if schedule == "linear":
        return 2.0 / (t + 1)
    if schedule == "quadratic":
        return min(1.0, 3.0 / (t + 2))
    if schedule == "kappa 0.7":
        return float(t**-0.7)
    raise ValueError(schedule)


def treat_s2(s2: Array, noise_std: float, method: str) -> Array:
    """Post-process the released (PSD) s2 knowing its per-entry noise std."""
    if method == "psd":
        return s2
    d = s2.shape[0]
    edge = noise_std * math.sqrt(d)  # half the Wigner spectral edge
    if method.startswith("ridge "):
        ridged: Array = s2 + float(method.split()[1]) * edge * np.eye(d)
        return ridged
    if method == "shrink":
        level = float(np.trace(s2)) / d
        excess = float(np.sum((s2 - level * np.eye(d)) ** 2))
        weight = min(1.0, d * d * noise_std**2 / max(excess, np.finfo(np.float64).tiny))
        shrunk: Array = (1 - weight) * s2 + weight * level * np.eye(d)
        return shrunk
    eigenvalues, vectors = np.linalg.eigh((s2 + s2.T) / 2)
    if method.startswith("soft "):
        k = float(method.split()[1])
        corrected = np.maximum(eigenvalues - k * edge, 0.0)
    elif method == "spike":
        edge2 = 4.0 * d * noise_std**2
        root = np.sqrt(np.maximum(eigenvalues**2 - edge2, 0.0))
        corrected = np.where(eigenvalues**2 > edge2, (eigenvalues + root) / 2.0, 0.0)
    else:
        raise ValueError(method)
    treated: Array = (vectors * corrected) @ vectors.T
    return treated


def split_sensitivity(ratio: float) -> float:
    """J_r = sqrt(max_c (1 + c)/2 + r^2 max(1 - c^2, 1/2)) over c in [0, 1] (J_1 = 5/4)."""
    c = np.linspace(0.0, 1.0, 100_001)
    return float(np.sqrt(np.max((1 + c) / 2 + ratio**2 * np.maximum(1 - c**2, 0.5))))


class SimulatedRelease:
    """Batch (S = N) releases with the query's clipped sums and post-processing and per-block noise
    stds (sigma J_r Delta_1, sigma J_r Delta_2 / r): a bench simulation of a mechanism the wall lacks."""

    def __init__(self, data: TabularData, sigma: float, ratio: float) -> None:
        self.batch = Batch(data.features, data.labels)
        self.population = data.features.shape[0]
        self.query = LogisticRegressionQuery()
        self.rng = np.random.default_rng()
        joint = split_sensitivity(ratio)
        deltas = {b.name: b.sensitivity(self.population) for b in self.query.blocks(data.features.shape[1])}
        self.noise_std = {"s1": sigma * joint * deltas["s1"], "s2": sigma * joint * deltas["s2"] / ratio}

    def release(self, params: dict[str, Array]) -> tuple[dict[str, Array], dict[str, float]]:
        sums = self.query.clipped_sums(self.batch, params, self.rng)
        noised = {
            name: value / self.population + self.rng.normal(0.0, self.noise_std[name], value.shape)
            for name, value in sums.items()
        }
        return self.query.postprocess(noised, self.batch.features.shape[1]), self.noise_std


_SIGMAS: dict[tuple[float, int, int], float] = {}


def sigma_for(epsilon: float, population: int, iterations: int) -> float:
    key = (epsilon, population, iterations)
    if key not in _SIGMAS:
        _SIGMAS[key] = calibrate_sigma(epsilon, population, population, iterations, DELTA)
    return _SIGMAS[key]


def fit(train: TabularData, epsilon: float, variant: Variant) -> BlrState:
    """One private batch fit: the real gate (or the split simulation) and the model's own M-step, with
    the variant's rho_t and s2 treatment between release and M-step."""
    population, dimension = train.features.shape
    sigma = sigma_for(epsilon, population, variant.iterations)
    model = BayesianLogisticRegression(noise_aware=variant.aware, laplace_from=0)
    query = LogisticRegressionQuery()
    state = model.initial_state(dimension)
    if variant.ratio == 1.0:
        store = InMemoryTabularStore("adult", train.features, train.labels, public=False)
        gate = Gate(store, InMemoryLedger(delta=DELTA), padded=False)
    else:
        simulated = SimulatedRelease(train, sigma, variant.ratio)
    for t in range(1, variant.iterations + 1):
        params = model.public_params(state)
        if variant.ratio == 1.0:
            release = gate.release(
                query, params, job_id="study", iteration=t, sigma=sigma, batch_size=population
            )
            statistics, noise_std = release.statistics, release.noise_std
        else:
            statistics, noise_std = simulated.release(params)
        statistics = {
            "s1": statistics["s1"],
            "s2": treat_s2(statistics["s2"], noise_std["s2"], variant.s2),
        }
        state = model.m_step(state, statistics, population, rho(variant.schedule, t), noise_std)
    return state


def auc(state: BlrState, data: TabularData) -> float:
    return float(roc_auc_score(data.labels, predict_proba(state.mean, state.covariance, data.features)))


@dataclass
class Scores:
    values: list[float] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    @property
    def sem(self) -> float:
        n = len(self.values)
        return float(np.std(self.values, ddof=1) / math.sqrt(n)) if n > 1 else math.nan


def folds(data: TabularData, k: int, seed: int = 0) -> list[tuple[TabularData, TabularData]]:
    order = np.random.default_rng(seed).permutation(data.features.shape[0])
    parts = np.array_split(order, k)

    def take(rows: NDArray[np.intp]) -> TabularData:
        return TabularData(data.features[rows], data.labels[rows], data.feature_names)

    return [(take(np.concatenate(parts[:i] + parts[i + 1 :])), take(parts[i])) for i in range(k)]


def cross_validate(
    splits: Sequence[tuple[TabularData, TabularData]], epsilon: float, variant: Variant, repeats: int
) -> Scores:
    scores = Scores()
    for train, valid in splits:
        for _ in range(repeats):
            scores.values.append(auc(fit(train, epsilon, variant), valid))
    return scores


def combine(choices: dict[str, Variant]) -> Variant:
    """The private (non-simulated) choices of directions a-c together."""
    a = choices["a: s2 treatment"]
    b = choices["b: release weights"]
    c = choices["c: iterations"]
    return replace(BASELINE, s2=a.s2, schedule=b.schedule, iterations=c.iterations)


def run(
    quick: bool,
    cv_repeats: int,
    test_repeats: int,
    epsilons: Sequence[float] = EPSILONS,
    only: Sequence[str] = (),
) -> str:
    data, test = load_adult("train"), load_adult("test")
    splits = folds(data, 3)
    epsilons = (0.8,) if quick else epsilons
    selected = {
        name: variants for name, variants in DIRECTIONS.items() if not only or name.split(":")[0] in only
    }
    directions = {name: variants[:2] for name, variants in selected.items()} if quick else selected
    cv_lines = ["| direction | variant | " + " | ".join(f"eps {e:g}" for e in epsilons) + " |"]
    cv_lines.append("|---|---|" + "---|" * len(epsilons))
    choices: dict[float, dict[str, Variant]] = {e: {} for e in epsilons}
    cv_cache: dict[tuple[float, Variant], Scores] = {}
    for direction, variants in directions.items():
        for variant in variants:
            cells = []
            for epsilon in epsilons:
                if (epsilon, variant) not in cv_cache:
                    start = time.perf_counter()
                    cv_cache[epsilon, variant] = cross_validate(splits, epsilon, variant, cv_repeats)
                    scores = cv_cache[epsilon, variant]
                    log(
                        f"[cv] {direction} | {variant.label()} | eps {epsilon:g}: {scores.mean:.4f} +- "
                        f"{scores.sem:.4f} ({time.perf_counter() - start:.0f} s)"
                    )
                scores = cv_cache[epsilon, variant]
                cells.append(f"{scores.mean:.4f} +- {scores.sem:.4f}")
            cv_lines.append(f"| {direction} | {variant.label()} | " + " | ".join(cells) + " |")
        for epsilon in epsilons:
            means = {variant: cv_cache[epsilon, variant].mean for variant in variants}
            choices[epsilon][direction] = max(means, key=means.__getitem__)
    test_lines = [
        "| epsilon | direction | CV choice | test AUC (mean +- s.e.) | gain over today (+- s.e.) |",
        "|---|---|---|---|---|",
    ]
    for epsilon in epsilons:
        runs: dict[Variant, Scores] = {}
        finals: list[tuple[str, Variant]] = [("today", BASELINE)]
        finals += list(choices[epsilon].items())
        if not quick and not only:
            finals.append(("a + b + c combined", combine(choices[epsilon])))
        for direction, variant in finals:
            if variant not in runs:
                start = time.perf_counter()
                runs[variant] = Scores([auc(fit(data, epsilon, variant), test) for _ in range(test_repeats)])
                log(
                    f"[test] eps {epsilon:g} | {variant.label()}: {runs[variant].mean:.4f} +- "
                    f"{runs[variant].sem:.4f} ({time.perf_counter() - start:.0f} s)"
                )
            scores, base = runs[variant], runs[BASELINE]
            gain = scores.mean - base.mean
            gain_se = math.hypot(scores.sem, base.sem) if variant != BASELINE else 0.0
            test_lines.append(
                f"| {epsilon:g} | {direction} | {variant.label()} | {scores.mean:.4f} +- {scores.sem:.4f} | "
                + ("-" if variant == BASELINE else f"{gain:+.4f} +- {gain_se:.4f}")
                + " |"
            )
    sigmas = ", ".join(
        f"eps {e:g} T {t}: {s:.2f}" for (e, n, t), s in sorted(_SIGMAS.items()) if n == data.features.shape[0]
    )
    return (
        "Cross-validation (3 folds of adult.data, validation AUC mean +- s.e. over "
        f"{3 * cv_repeats} fits):\n\n" + "\n".join(cv_lines) + "\n\n"
        f"Test (adult.test, {test_repeats} independent fits on all of adult.data per row):\n\n"
        + "\n".join(test_lines)
        + f"\n\nsigma (N = {data.features.shape[0]}): {sigmas}\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="eps 0.8, two variants per direction")
    parser.add_argument("--cv-repeats", type=int, default=4, help="fits per fold and variant (4)")
    parser.add_argument("--test-repeats", type=int, default=10, help="test fits per final choice (10)")
    parser.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS))
    parser.add_argument("--directions", default="", help="letters to run, e.g. 'e' (default: all)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args(argv)
    if abs(split_sensitivity(1.0) - JOINT_SENSITIVITY) > 1e-6:
        raise AssertionError("the r = 1 split must reproduce the wall's J = 5/4")
    start = time.perf_counter()
    only = [letter for letter in args.directions.split(",") if letter]
    epsilons = [float(e) for e in args.epsilons.split(",")]
    text = run(args.quick, args.cv_repeats, args.test_repeats, epsilons, only)
    elapsed = time.perf_counter() - start
    command = "python -m bench.blr_study" + (" --quick" if args.quick else "")
    if only:
        command += f" --directions {args.directions} --epsilons {args.epsilons}"
    text = f"Produced by `{command}` in {elapsed:.0f} s.\n\n{text}"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "blr_study_quick" if args.quick else "blr_study"
    if only:
        stem += "_" + "".join(only)
    (args.out / f"{stem}.md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
