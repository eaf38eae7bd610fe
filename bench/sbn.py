"""VIPS sigmoid belief networks: reconstruction against privacy (VIPS paper Sec. 7.1, Fig. 8).

Two datasets, each fitted through the real pieces (InMemoryBinaryStore, Gate, InMemoryLedger, run_vips):

- synthetic: the paper's MNIST setting in size (N = 60,000 training rows, one epoch T = N // S, sigma = 1
  under the moments accountant, delta = 1e-4, S in {400, 800, 1600, 3200}, giving the paper's epsilons
  1.34 / 1.74 / 2.44 / 3.34), on rows drawn from a known SBN with J = 64 visible and K = 8 hidden units
  (each W_jk non-zero with probability 0.3, random sign, magnitude U(3, 6)); 2,000 held-out rows;
- digits: scikit-learn's 8 x 8 digits binarised at grey level > 7 (vips/datasets/digits.py; 1,347 train,
  450 test), K = 10, three epochs T = 3 N // S, delta = 1e-5, S in {100, 200, 400, 800}.

For each batch size S the target epsilon is what sigma = 1 costs under the moments accountant (the paper's
recipe). Three fits at that S: non-private (sigma = 0), moments accountant (sigma = calibrate_sigma(eps)) and
strong composition (sigma = calibrate_sigma_strong(eps), the paper's comparison: more noise for the same
epsilon). Step sizes rho_t = (tau0 + t)^-kappa with tau0 = 1, kappa = 0.7. Metrics on the held-out rows:
reconstruction pixel accuracy and negative log-likelihood in nats per image (q(z | y) by the fixed-iteration
E-step, then p(y_j = 1 | <z>)); baselines: per-pixel training frequencies and, for the synthetic data, the
true parameters.

    python -m bench.sbn [--quick] [--repeats R] [--out DIR]
    python -m bench.sbn --images [--repeats R] [--epsilons 0.5,1,2,5,10] [--frequency-copies rule,1,2,4,8]
                        [--iterations T] [--init-scale A] [--private-only]

--images (issue 35): 28 x 28 binarised digits (the 8 x 8 digits upsampled bilinearly by 3.5, shifted by up
to 2 pixels, threshold > 7; 4,000 training images drawn from the training split with a public seed, the 450
test-split images held out), K = 50, S = 400, T = 50, rho_t = t^-kappa (tau0 = 0, the service default
kappa = 1, and kappa = 0.6): non-private SBN next to scikit-learn's BernoulliRBM with 50 units (its
reconstruction NLL through p(h | v), learning rates 0.1 / 0.02 / 0.005 with 10 / 40 / 150 epochs), and the
private SBN's NLL against epsilon (delta 1e-5) next to the exact per-pixel means, each private fit with the
schedule the service chooses from epsilon alone (control.planning.schedules, ("sbn", "vips"): S = N, T by
epsilon x N) and kappa 1; CPU seconds per iteration. --frequency-copies runs each epsilon at each listed k
("rule": the rule's choice; the table's "rule's choice" column shows what the rule picks: T and k),
--iterations fixes T, --init-scale the model's init_scale, --private-only leaves out the RBM and the
non-private fits.

Measured 2026-11-28 (mean over 3 fits, private fits at S = N = 4,000, T 3, kappa 1; the full table with
k 1 / 2 / 4 / 8 and T 3 / 10 up to epsilon 200 is in docs/schedules.md, "VIPS-SBN"): with k 8 NLL
356.7 / 350.2 / 348.0 / 346.7 / 346.6 at epsilon 0.5 / 1 / 2 / 5 / 10 (k 1: 373.9 / 357.1 / 350.3 / 347.5 /
347.0), against 346.5 for the exact per-pixel means. Every hidden unit is switched off at these scales
(epsilon x N <= 40,000): what is left above the pixel means is the noise of the released pixel frequencies
(its floor, even with the whole budget on s3, is one Gaussian release of sensitivity sqrt(J) / N). Above,
k 1: 344.4 / 320.3 / 226.7 / 204.9 at epsilon 15 / 20 / 50 / 100 (T 3; k 4: 346.6 / 336.7 / 244.0 / 210.6),
190.7 and 172.5 at epsilon 100 and 200 with T 10. Non-private: 127.9 +- 0.4 (kappa 1), 118.1 +- 1.0
(kappa 0.6); BernoulliRBM best 138.4 +- 1.0. CPU ~3.1 s per iteration at S = 4,000 whatever k. With the
service's rule (then k 8 up to epsilon x N 16,000; above one copy and init_scale 3, T 1 up to 100,000), the
"rule" column: 350.5 / 346.1 / 307.6 / 263.3 / 210.8 / 190.5 at epsilon 1 / 5 / 10 / 20 / 50 / 100. Those
are reconstruction NLLs; the table now prints the held-out NLL (importance-sampled) beside it, and the
rule was re-read by it (docs/schedules.md, "VIPS-SBN by held-out likelihood").

Private fits cannot be seeded (OS CSPRNG): repeats are independent; non-private repeats use model seeds
0..R-1 for the initial weights. Writes sbn.md and sbn.png (sbn_quick.* with --quick) to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from scipy.special import expit

from bench.strong_composition import calibrate_sigma_strong, strong_composition_epsilon
from control.planning.schedules import choose_schedule
from privacy_wall.accounting.calibration import calibrate_sigma, epsilon
from privacy_wall.data.store import InMemoryBinaryStore
from privacy_wall.gate import Gate
from privacy_wall.ledger.base import InMemoryLedger
from privacy_wall.queries.sbn import DEFAULT_FREQUENCY_COPIES
from vips.datasets.digits import load_binary_digits
from vips.models.sbn.model import (
    SigmoidBeliefNetwork,
    heldout_nll,
    pixel_mean_metrics,
    reconstruction_metrics,
)
from vips.runner import LoopSettings, run_vips

Array = NDArray[np.float64]

TAU0 = 1.0
KAPPA = 0.7
REFERENCE_SIGMA = 1.0
METHODS = ("non-private", "moments accountant", "strong composition")


@dataclass(frozen=True)
class Dataset:
    name: str
    train: Array
    test: Array
    hidden: int
    epochs: int
    delta: float
    batch_sizes: tuple[int, ...]
    truth: tuple[Array, Array, Array] | None = None


@dataclass
class Row:
    """Repeated fits of one method at one batch size."""

    dataset: str
    method: str
    batch_size: int
    iterations: int
    sigma: float
    epsilon: float  # what the ledger (RDP, moments accountant) charged
    epsilon_strong: float  # what strong composition would state for the same sigma
    accuracy: list[float] = field(default_factory=list)
    nll: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def synthetic_sbn(visible: int = 64, hidden: int = 8) -> tuple[Array, Array, Array]:
    g = np.random.default_rng(42)
    mask = g.random((visible, hidden)) < 0.3
    w = mask * g.choice([-1.0, 1.0], size=(visible, hidden)) * g.uniform(3, 6, size=(visible, hidden))
    c = -0.5 * w.sum(axis=1) + g.normal(0, 0.5, visible)
    b = g.normal(-0.5, 0.5, hidden)
    return w, b, c


def sample_sbn(w: Array, b: Array, c: Array, n: int, rng: np.random.Generator) -> Array:
    z = (rng.random((n, w.shape[1])) < expit(b)).astype(np.float64)
    return (rng.random((n, w.shape[0])) < expit(z @ w.T + c)).astype(np.float64)


def datasets(quick: bool) -> list[Dataset]:
    w, b, c = synthetic_sbn()
    rng = np.random.default_rng(0)
    train, test = sample_sbn(w, b, c, 60_000, rng), sample_sbn(w, b, c, 2_000, rng)
    sizes = (1600,) if quick else (400, 800, 1600, 3200)
    out = [Dataset("synthetic", train, test, 8, 1, 1e-4, sizes, (w, b, c))]
    digits_sizes = (200,) if quick else (100, 200, 400, 800)
    out.append(
        Dataset("digits", load_binary_digits("train"), load_binary_digits("test"), 10, 3, 1e-5, digits_sizes)
    )
    return out


def fit_once(data: Dataset, batch_size: int, iterations: int, sigma: float, seed: int) -> dict[str, float]:
    population = data.train.shape[0]
    private = sigma > 0
    store = InMemoryBinaryStore(data.name, data.train, public=not private)
    ledger = InMemoryLedger(delta=data.delta)
    gate = Gate(store, ledger, seed=None if private else seed, padded=False)
    model = SigmoidBeliefNetwork(hidden=data.hidden, seed=seed)
    result = run_vips(
        gate,
        model.query(),
        model,
        LoopSettings(iterations, batch_size, sigma, TAU0, KAPPA),
        job_id=f"{data.name}-{batch_size}-{sigma:g}-{seed}",
        dimension=data.train.shape[1],
        population=population,
    )
    state = result.state
    metrics = reconstruction_metrics(data.test, state.w_mean, state.b_mean, state.c_mean)
    metrics["epsilon"] = ledger.epsilon_spent()
    return metrics


def run(quick: bool, repeats: int) -> tuple[list[Row], dict[str, dict[str, float]]]:
    rows: list[Row] = []
    baselines: dict[str, dict[str, float]] = {}
    for data in datasets(quick):
        n = data.train.shape[0]
        baselines[f"{data.name}: per-pixel mean"] = pixel_mean_metrics(data.train, data.test)
        if data.truth is not None:
            w, b, c = data.truth
            baselines[f"{data.name}: true parameters"] = reconstruction_metrics(data.test, w, b, c)
        for size in data.batch_sizes:
            iterations = data.epochs * n // size
            target = epsilon(REFERENCE_SIGMA, size, n, iterations, data.delta)
            sigmas = {
                "non-private": 0.0,
                "moments accountant": calibrate_sigma(target, size, n, iterations, data.delta),
                "strong composition": calibrate_sigma_strong(target, size, n, iterations, data.delta),
            }
            for method in METHODS:
                sigma = sigmas[method]
                strong = strong_composition_epsilon(sigma, size, n, iterations, data.delta)
                row = Row(data.name, method, size, iterations, sigma, math.inf, strong)
                for seed in range(repeats):
                    start = time.perf_counter()
                    metrics = fit_once(data, size, iterations, sigma, seed)
                    row.seconds.append(time.perf_counter() - start)
                    row.accuracy.append(metrics["pixel_accuracy"])
                    row.nll.append(metrics["nll"])
                    row.epsilon = metrics["epsilon"]
                rows.append(row)
                log(
                    f"[{data.name}] S = {size}, T = {iterations}, {method}: sigma {sigma:.3f}, "
                    f"eps {row.epsilon:.3f} (strong composition {row.epsilon_strong:.3f}), "
                    f"accuracy {np.mean(row.accuracy):.4f}, "
                    f"NLL {np.mean(row.nll):.2f} ({np.mean(row.seconds):.1f} s per fit)"
                )
    return rows, baselines


def digits_28(train_size: int = 4000, seed: int = 0) -> tuple[Array, Array]:
    """(train, test) 28 x 28 binarised digits (module docstring): public data, a public seed."""
    from scipy import ndimage
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    images = np.asarray(load_digits().images, dtype=np.float64)
    train, test = train_test_split(images, test_size=0.25, random_state=0)

    def binarise(image: Array, shift: tuple[int, int] = (0, 0)) -> Array:
        big = ndimage.shift(ndimage.zoom(image, 3.5, order=1), shift, order=0, cval=0.0)
        return np.asarray(big > 7, dtype=np.float64).reshape(-1)

    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(train), train_size)
    shifts = rng.integers(-2, 3, size=(train_size, 2))
    rows = np.stack(
        [binarise(train[i], (int(dy), int(dx))) for i, (dy, dx) in zip(picks, shifts, strict=True)]
    )
    return rows, np.stack([binarise(image) for image in test])


def rbm_nll(train: Array, test: Array, hidden: int, learning_rate: float, epochs: int, seed: int) -> float:
    """BernoulliRBM reconstruction NLL: -log p(v | E[h | v]) with p(v_j = 1 | h) = sigmoid(W_j h + a_j)."""
    from sklearn.neural_network import BernoulliRBM

    from vips.models.sbn.model import bernoulli_nll

    rbm = BernoulliRBM(n_components=hidden, learning_rate=learning_rate, n_iter=epochs, random_state=seed)
    rbm.fit(train)
    logits = rbm.transform(test) @ rbm.components_ + rbm.intercept_visible_
    return float(np.mean(bernoulli_nll(test, logits)))


def fit_images(
    train: Array,
    test: Array,
    sigma: float,
    kappa: float,
    seed: int,
    batch_size: int = 400,
    iterations: int = 50,
    frequency_copies: int = DEFAULT_FREQUENCY_COPIES,
    init_scale: float | None = None,
) -> tuple[float, float, float, float]:
    """(held-out NLL by importance sampling, reconstruction NLL, ledger epsilon, CPU seconds per iteration)
    of one SBN fit, K 50 (S 400, T 50 and the model's default frequency_copies and init_scale unless
    given); vips.models.sbn.model.heldout_nll and reconstruction_metrics say what each score is."""
    private = sigma > 0
    ledger = InMemoryLedger(delta=1e-5)
    gate = Gate(
        InMemoryBinaryStore("digits28", train, public=not private),
        ledger,
        seed=None if private else seed,
        padded=False,
    )
    model = SigmoidBeliefNetwork(hidden=50, seed=seed, frequency_copies=frequency_copies)
    if init_scale is not None:
        model = dataclasses.replace(model, init_scale=init_scale)
    start = time.process_time()
    result = run_vips(
        gate,
        model.query(),
        model,
        LoopSettings(iterations, batch_size, sigma, 0.0, kappa),
        job_id=f"digits28-{sigma:g}-{seed}",
        dimension=train.shape[1],
        population=train.shape[0],
    )
    seconds = (time.process_time() - start) / iterations
    state = result.state
    heldout = heldout_nll(test, state.w_mean, state.b_mean, state.c_mean, seed=seed)["nll"]
    reconstruction = reconstruction_metrics(test, state.w_mean, state.b_mean, state.c_mean)["nll"]
    return heldout, reconstruction, ledger.epsilon_spent(), seconds


def run_images(
    repeats: int,
    epsilons: Sequence[float],
    copies: Sequence[int | None] = (None,),
    iterations: int | None = None,
    baselines: bool = True,
    init_scale: float | None = None,
) -> str:
    """The --images table (markdown): mean +- std over `repeats` seeds / independent private fits. Private
    fits: for each epsilon and each entry of `copies` (None: what the service's rule chooses from epsilon x N,
    else that frequency_copies), T from the rule unless `iterations` is given. `baselines` False leaves out
    the RBM and the non-private fits; `init_scale` replaces the model's default."""
    train, test = digits_28()
    lines = [
        "| method | held-out NLL (nats/image) | reconstruction NLL | eps | eps x N | rule's choice "
        "| CPU s/iteration | runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base = pixel_mean_metrics(train, test)["nll"]
    lines.append(f"| per-pixel means (exact) | {base:.1f} | {base:.1f} | inf | | | | 1 |")
    if baselines:
        for rate, epochs in ((0.1, 10), (0.02, 40), (0.005, 150)):
            values = [rbm_nll(train, test, 50, rate, epochs, seed) for seed in range(repeats)]
            lines.append(
                f"| BernoulliRBM 50, lr {rate}, {epochs} epochs (no held-out likelihood) | | "
                f"{_fmt(values, 1)} | inf | | | | {repeats} |"
            )
            log(lines[-1])
    population = train.shape[0]
    settings: list[tuple[float, float, int | None]] = []
    if baselines:
        settings += [(math.inf, 1.0, None), (math.inf, 0.6, None)]
    settings += [(e, 1.0, k) for e in epsilons for k in copies]
    for eps, kappa, chosen_copies in settings:
        scale_0 = init_scale
        if math.isinf(eps):
            size, steps, sigma, k, rule = 400, 50, 0.0, DEFAULT_FREQUENCY_COPIES, ""
        else:
            schedule = choose_schedule("sbn", "vips", population, eps, dimension=train.shape[1])
            rule_copies = int(schedule.options.get("frequency_copies", DEFAULT_FREQUENCY_COPIES))
            rule_scale = schedule.options.get("init_scale")
            rule = f"T {schedule.iterations}, copies {rule_copies}" + (
                "" if rule_scale is None else f", init_scale {rule_scale:g}"
            )
            size = schedule.batch_size
            steps = schedule.iterations if iterations is None else iterations
            k = rule_copies if chosen_copies is None else chosen_copies
            if scale_0 is None and chosen_copies is None:  # the rule's whole choice
                scale_0 = rule_scale
            sigma = calibrate_sigma(eps, size, population, steps, 1e-5)
        fits = [
            fit_images(train, test, sigma, kappa, seed, size, steps, k, scale_0) for seed in range(repeats)
        ]
        heldout, reconstruction = [f[0] for f in fits], [f[1] for f in fits]
        label = f"SBN 50, S {size}, T {steps}, kappa {kappa:g}" + (
            "" if sigma == 0 else f", copies {k}, sigma {sigma:.3f}"
        )
        cpu = np.median([f[3] for f in fits])
        scale = "" if math.isinf(eps) else f"{eps * population:.3g}"
        lines.append(
            f"| {label} | {_fmt(heldout, 1)} | {_fmt(reconstruction, 1)} | {fits[0][2]:.2f} | {scale} | "
            f"{rule} | {cpu:.2f} | {repeats} |"
        )
        log(lines[-1])
    return "\n".join(lines) + "\n"


def _fmt(values: list[float], digits: int) -> str:
    return f"{np.mean(values):.{digits}f} +- {np.std(values):.{digits}f}"


def markdown(rows: Sequence[Row], baselines: dict[str, dict[str, float]]) -> str:
    columns = (
        "dataset",
        "S",
        "T",
        "method",
        "sigma",
        "eps (MA)",
        "eps (SC)",
        "pixel accuracy",
        "NLL",
        "runs",
    )
    lines = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    for row in rows:
        eps, strong = (f"{e:.3f}" if math.isfinite(e) else "inf" for e in (row.epsilon, row.epsilon_strong))
        lines.append(
            f"| {row.dataset} | {row.batch_size} | {row.iterations} | {row.method} | {row.sigma:.3f} | "
            f"{eps} | {strong} | {_fmt(row.accuracy, 4)} | {_fmt(row.nll, 2)} | {len(row.accuracy)} |"
        )
    lines += ["", "| baseline | pixel accuracy | NLL (nats/image) |", "|---|---|---|"]
    for name, metrics in baselines.items():
        lines.append(f"| {name} | {metrics['pixel_accuracy']:.4f} | {metrics['nll']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[Row], baselines: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({row.dataset for row in rows}, key=lambda name: name != "synthetic")
    figure, axes = plt.subplots(2, len(names), figsize=(5.5 * len(names), 7.0), squeeze=False)
    colours = {"non-private": "k", "moments accountant": "tab:red", "strong composition": "tab:blue"}
    for col, name in enumerate(names):
        for r, (metric, label) in enumerate((("accuracy", "pixel accuracy"), ("nll", "NLL (nats / image)"))):
            ax = axes[r][col]
            for method in METHODS:
                series = [row for row in rows if row.dataset == name and row.method == method]
                xs = [row.batch_size for row in series]
                values = [getattr(row, metric) for row in series]
                ax.errorbar(
                    xs,
                    [np.mean(v) for v in values],
                    yerr=[np.std(v) for v in values],
                    fmt="o-",
                    capsize=3,
                    color=colours[method],
                    label=method,
                )
            for base, metrics in baselines.items():
                if base.startswith(name):
                    key = "pixel_accuracy" if metric == "accuracy" else "nll"
                    style = ":" if "pixel mean" in base else "--"
                    ax.axhline(metrics[key], color="grey", linestyle=style, label=base.split(": ")[1])
            series = [row for row in rows if row.dataset == name and row.method == "moments accountant"]
            ax.set_xscale("log", base=2)
            ax.set_xticks([row.batch_size for row in series])
            ax.set_xticklabels([f"{row.batch_size}\neps {row.epsilon:.2f}" for row in series])
            ax.set_xlabel("batch size S (epsilon of the private fits)")
            ax.set_ylabel(label)
            ax.set_title(f"{name}: {label}")
            ax.grid(True, alpha=0.3)
            if r == 0:
                ax.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one batch size per dataset, 2 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="fits per setting (5; 2 with --quick)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    parser.add_argument("--images", action="store_true", help="28 x 28 digits: RBM and the epsilon curve")
    parser.add_argument("--epsilons", default="0.5,1,2,5,10", help="with --images")
    parser.add_argument(
        "--frequency-copies",
        default="rule",
        help="with --images: comma-separated frequency_copies of the private fits ('rule': the service's "
        "choice from epsilon x N); e.g. rule,1,2,4",
    )
    parser.add_argument("--iterations", type=int, default=None, help="with --images: T (default: the rule's)")
    parser.add_argument(
        "--init-scale", type=float, default=None, help="with --images: the model's init_scale"
    )
    parser.add_argument(
        "--private-only", action="store_true", help="with --images: no RBM and no non-private fits"
    )
    args = parser.parse_args(argv)
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 5)
    if repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.images:
        copies = [None if c.strip() == "rule" else int(c) for c in args.frequency_copies.split(",")]
        table = run_images(
            repeats,
            [float(e) for e in args.epsilons.split(",")],
            copies,
            args.iterations,
            not args.private_only,
            args.init_scale,
        )
        print(table)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sbn_images.md").write_text(table, encoding="utf-8")
        return 0
    start = time.perf_counter()
    rows, baselines = run(args.quick, repeats)
    elapsed = time.perf_counter() - start
    command = (
        "python -m bench.sbn"
        + (" --quick" if args.quick else "")
        + (f" --repeats {args.repeats}" if args.repeats is not None else "")
    )
    table = markdown(rows, baselines)
    print(table)
    print(f"({elapsed:.1f} s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "sbn_quick" if args.quick else "sbn"
    (args.out / f"{stem}.md").write_text(
        f"Produced by `{command}` in {elapsed:.0f} s.\n\n{table}", encoding="utf-8"
    )
    plot(rows, baselines, args.out / f"{stem}.png")
    log(f"wrote {args.out / (stem + '.md')} and {args.out / (stem + '.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
