"""VIPS for LDA (paper Sec. 4): speed and held-out perplexity against scikit-learn and gensim, and privacy.

Sections:

- wikipedia (non-private): VIPS-LDA at sigma = 0 vs scikit-learn's LatentDirichletAllocation
  (learning_method="online") and gensim's LdaModel on the bundled Wikipedia paragraphs
  (vips.datasets.wikipedia; training documents shuffled once, seed 0), with the same K, minibatch size S,
  passes P (VIPS: T = P D / S iterations, in shuffled passes like the libraries, and with the uniform
  minibatches private fits use), alpha = eta = 1/K and step sizes
  rho_t = (tau0 + t)^-kappa (gensim: its own formula with offset = tau0, decay = kappa). Documents per
  second of fitting (one thread each: BLAS limited to 1 thread) and held-out perplexity, all computed by
  the same code (vips.models.lda.model) from each library's lambda: document completion and the paper's bound.
- private (synthetic): a corpus with planted topics (vips.datasets.synthetic_lda, D >= 100,000) at the
  paper's sampling rate S / D = 0.05, T = 20 iterations (one epoch), N_w = 500, epsilon ~2.4 at
  delta = 1e-4: sigma from the moments accountant (privacy_wall.accounting.calibration.calibrate_sigma) vs
  strong composition (calibrate_sigma_strong), clipping a = 0.1 vs none (a = 1: the bound N_w), and the
  unigram
  baseline; held-out perplexity per iteration (the paper's Fig. 3).
- --sweep: how much data and epsilon private LDA needs before its topics beat the unigram baseline on
  held-out completion perplexity: epsilon 1, 2.4, 10, 100 (delta 1e-4, sigma by the `pld` accountant) and
  sigma = 0, on the README's job (the bundled corpus, K = 50, S = 2,000, T = 20, N_w = 500, a = 0.1) and on
  planted-topic corpora shaped like it (V = 5,000, ~50 tokens, K = 20) of growing D at S / D = 0.05, T = 20.
- --sweep-unigram: the unigram fallback (issue 36) on the LDA schedule rule's rows
(control.planning.schedules: T and
  unigram_share by epsilon x D, S = D) at epsilon 0.5-10 and sigma 0, on the bundled corpus, planted-topic
  corpora and a stand-in from a third generator (`dirichlet_corpus`), against the training unigram.
  With --text-csv, a public CSV text corpus (bench.text_corpus) instead of the bundled one, at K 50 and 10.
- --full: the paper's scale (D = 400,000, V = 5,000, K = 50, S = 20,000, N_w = 500, T = 20, sigma = 1.24)
  on a synthetic corpus: seconds per iteration and peak RSS, beside scikit-learn's online LDA updates on
  minibatches of the same size from the same corpus (the ratio of seconds per iteration).

    python -m bench.lda [--quick] [--seeds N] [--out DIR]
    python -m bench.lda --full [--sklearn-batches N] [--out DIR]
    python -m bench.lda --whole-process [--repeats R]   # `vips fit --local` as a process vs scikit-learn
    python -m bench.lda --sweep [--sweep-sizes 2786,10000]  # private LDA vs the unigram baseline
    python -m bench.lda --sweep-unigram 2 [--unigram-sizes 3000,30000]  # the unigram fallback, LDA rule
    python -m bench.lda --sweep-unigram 2 --unigram-sizes "" --text-csv NewsArticles.csv  # held-out text

Fits run through the real pieces: an in-memory store, privacy_wall.gate.Gate, an InMemoryLedger and
vips.runner.run_vips. Private fits cannot be seeded (OS CSPRNG): their repeats are independent runs.
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from bench.lda_common import (
    CLIP,
    DOC_LENGTH,
    FULL_BATCH,
    FULL_SETTING,
    FULL_SIGMA,
    INNER_ITERATIONS,
    KAPPA,
    PRIVATE_DELTA,
    PRIVATE_EPSILON,
    PRIVATE_ITERATIONS,
    PRIVATE_KAPPA,
    PRIVATE_RATE,
    PRIVATE_SETTING,
    PRIVATE_TAU0,
    QUICK_PRIVATE_SETTING,
    TAU0,
    WIKI_BATCH,
    WIKI_PASSES,
    WIKI_TOPICS,
    Counts,
    Evaluation,
    Row,
    eps_text,
    gensim_fit,
    log,
    mean_std,
    sklearn_fit,
    synthetic_data,
    vips_fit,
)
from bench.lda_full import full_mode, full_worker_mode
from bench.lda_sweeps import (
    SWEEP_SIZES,
    TEXT_TOPICS,
    UNIGRAM_EPSILONS,
    sweep_markdown,
    sweep_section,
    sweep_summary,
    unigram_sweep_section,
)
from bench.strong_composition import calibrate_sigma_strong, strong_composition_epsilon
from bench.text_corpus import text_corpus
from privacy_wall.accounting.calibration import calibrate_sigma, epsilon
from privacy_wall.data.store import InMemoryBowStore
from privacy_wall.queries.lda import (
    fit_chunks,
    resample_documents,
    sanitize_counts,
    shifted_topic_word,
)
from vips.datasets.wikipedia import load_wikipedia
from vips.models.lda.model import (
    expected_log_beta,
    unigram_perplexity,
)


def wikipedia_section(seeds: int, article_order: bool) -> list[Row]:
    corpus = load_wikipedia()
    permutation = np.random.default_rng(0).permutation(corpus.train.shape[0])
    shuffled = sp.csr_array(corpus.train[permutation])
    documents = shuffled.shape[0]
    topics = WIKI_TOPICS
    evaluation = Evaluation.of(corpus.test, 1.0 / topics)
    iterations = round(WIKI_PASSES * documents / WIKI_BATCH)
    processed = WIKI_PASSES * documents
    setting = f"K = {topics}, S = {WIKI_BATCH}, {WIKI_PASSES} passes, tau0 = {TAU0:g}, kappa = {KAPPA:g}"
    rows = {
        "vips": Row(
            "wikipedia",
            "VIPS-LDA (sigma = 0, shuffled passes)",
            f"{setting}, T = {iterations}, {INNER_ITERATIONS} inner",
        ),
        "vips-uniform": Row(
            "wikipedia",
            "VIPS-LDA (sigma = 0, uniform minibatches as private fits draw them)",
            f"{setting}, T = {iterations}, {INNER_ITERATIONS} inner",
        ),
        "sklearn": Row("wikipedia", "scikit-learn online LDA", f"{setting}, max_doc_update_iter = 100"),
        "gensim": Row("wikipedia", "gensim LdaModel", f"{setting}, iterations = 50"),
    }
    if article_order:
        rows["sklearn-ordered"] = Row("wikipedia", "scikit-learn online LDA", f"{setting}, article order")
        rows["gensim-ordered"] = Row("wikipedia", "gensim LdaModel", f"{setting}, article order")
    log(f"wikipedia: {documents} train / {corpus.test.shape[0]} test documents, V = {len(corpus.vocabulary)}")
    store = InMemoryBowStore("wikipedia", shuffled, public=True)

    def record(key: str, lam: np.ndarray, seconds: float) -> None:
        row = rows[key]
        row.seconds.append(seconds)
        row.docs_per_second.append(processed / seconds)
        row.completion.append(evaluation.completion(lam))
        row.bound.append(evaluation.bound(lam))
        log(
            f"  {row.method} ({key}): {processed / seconds:.0f} docs/s, completion perplexity "
            f"{row.completion[-1]:.1f}, bound {row.bound[-1]:.1f}"
        )

    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Methods alternate within each seed, so background load affects them alike.
        for seed in range(seeds):
            for key, passes in (("vips", True), ("vips-uniform", False)):
                fit = vips_fit(
                    shuffled,
                    topics=topics,
                    sigma=0.0,
                    batch_size=WIKI_BATCH,
                    iterations=iterations,
                    doc_length=0,
                    clip=1.0,
                    tau0=TAU0,
                    kappa=KAPPA,
                    delta=1e-5,
                    seed=seed,
                    store=store,
                    passes=passes,
                )
                record(key, fit.state.lam, fit.seconds)
            record("sklearn", *sklearn_fit(shuffled, topics, seed))
            record("gensim", *gensim_fit(shuffled, topics, seed))
            if article_order:
                record("sklearn-ordered", *sklearn_fit(corpus.train, topics, seed))
                record("gensim-ordered", *gensim_fit(corpus.train, topics, seed))
    return list(rows.values())


# --------------------------------------------------------------------------------------------------------
# (b) Private, synthetic.


def private_section(quick: bool, repeats: int) -> tuple[list[Row], dict[str, float]]:
    setting = QUICK_PRIVATE_SETTING if quick else PRIVATE_SETTING
    start = time.perf_counter()
    data = synthetic_data(setting)
    log(f"private: generated D = {setting.documents} in {time.perf_counter() - start:.1f} s")
    documents, topics = setting.documents, setting.topics
    batch = round(PRIVATE_RATE * documents)
    doc_length = 100 if quick else DOC_LENGTH
    sigma_ma = calibrate_sigma(PRIVATE_EPSILON, batch, documents, PRIVATE_ITERATIONS, PRIVATE_DELTA)
    sigma_strong = calibrate_sigma_strong(
        PRIVATE_EPSILON, batch, documents, PRIVATE_ITERATIONS, PRIVATE_DELTA
    )
    info: dict[str, float] = {
        "clipped_fraction": math.nan,
        "sigma_ma": sigma_ma,
        "sigma_strong": sigma_strong,
        "epsilon_ma": epsilon(sigma_ma, batch, documents, PRIVATE_ITERATIONS, PRIVATE_DELTA),
        "strong_epsilon_of_strong_sigma": strong_composition_epsilon(
            sigma_strong, batch, documents, PRIVATE_ITERATIONS, PRIVATE_DELTA
        ),
        "ma_epsilon_of_strong_sigma": epsilon(
            sigma_strong, batch, documents, PRIVATE_ITERATIONS, PRIVATE_DELTA
        ),
        "batch": batch,
        "doc_length": doc_length,
    }
    log(f"  sigma: moments accountant {sigma_ma:.3f}, strong composition {sigma_strong:.3f}")
    base = (
        f"D = {documents}, V = {setting.vocabulary}, K = {topics}, S = {batch}, T = {PRIVATE_ITERATIONS}, "
        f"N_w = {doc_length}"
    )
    configurations = [
        ("non-private (sigma = 0)", 0.0, CLIP, 1),
        ("moments accountant, clip a = 0.1", sigma_ma, CLIP, repeats),
        ("moments accountant, no clipping (a = 1)", sigma_ma, 1.0, repeats),
        ("strong composition, clip a = 0.1", sigma_strong, CLIP, repeats),
    ]
    rows: list[Row] = []
    store = InMemoryBowStore("synthetic", data.train, public=False)
    public_store = InMemoryBowStore("synthetic", data.train, public=True)
    with threadpool_limits(1):
        for method, sigma, clip, runs in configurations:
            setting = base + (
                f"; eps {PRIVATE_EPSILON} by strong composition, the table's epsilon is the ledger's (RDP)"
                if sigma == sigma_strong
                else ""
            )
            row = Row("private", f"VIPS-LDA, {method}", setting, sigma=sigma)
            for run in range(runs):
                curve: list[float] = []
                fit = vips_fit(
                    data.train,
                    topics=topics,
                    sigma=sigma,
                    batch_size=batch,
                    iterations=PRIVATE_ITERATIONS,
                    doc_length=doc_length,
                    clip=clip,
                    tau0=PRIVATE_TAU0,
                    kappa=PRIVATE_KAPPA,
                    delta=PRIVATE_DELTA,
                    seed=0,
                    on_iteration=(lambda _t, state, c=curve: c.append(data.evaluation.completion(state.lam)))
                    if run == 0
                    else None,
                    store=public_store if sigma == 0 else store,
                )
                row.epsilon = fit.epsilon
                row.seconds.append(fit.seconds)
                if sigma == sigma_ma and clip == CLIP:
                    info["clipped_fraction"] = clipped_fraction(data.train, fit.state.lam, doc_length, clip)
                row.completion.append(data.evaluation.completion(fit.state.lam))
                row.bound.append(data.evaluation.bound(fit.state.lam))
                if curve:
                    row.curve = curve
                log(
                    f"  {method}: sigma {sigma:.3f}, eps {fit.epsilon:.3f}, completion "
                    f"{row.completion[-1]:.1f}, bound {row.bound[-1]:.1f} ({fit.seconds:.0f} s)"
                )
            rows.append(row)
    unigram = Row("private", "unigram (non-private word frequencies)", base)
    unigram.completion.append(unigram_perplexity(data.train, data.evaluation.held_out))
    unigram.bound.append(unigram_perplexity(data.train, data.evaluation.counts))
    rows.append(unigram)
    truth = Row("private", "true topics (oracle)", base)
    truth.completion.append(data.evaluation.completion(data.truth * 1e7))
    truth.bound.append(data.evaluation.bound(data.truth * 1e7))
    rows.append(truth)
    return rows, info


def clipped_fraction(
    counts: Counts, lam: np.ndarray, doc_length: int, clip: float, sample: int = 2000
) -> float:
    """Fraction of (resampled) documents whose contribution the wall clips at these topics (public
    diagnostic on the synthetic corpus; the paper reports about 3/4 on Wikipedia at a = 0.1)."""
    rng = np.random.default_rng(0)
    rows = rng.choice(counts.shape[0], size=min(sample, counts.shape[0]), replace=False)
    resampled = resample_documents(sanitize_counts(sp.csr_array(counts[rows])), doc_length, rng)
    table, _ = shifted_topic_word(expected_log_beta(lam))
    clipped = 0
    for chunk in fit_chunks(resampled, table, 1.0 / lam.shape[0], INNER_ITERATIONS, None):
        contribution = chunk.topic_word * chunk.doc_topic[:, :, None] * chunk.ratio[:, None, :]
        norms = np.sqrt(np.einsum("dkm,dkm->d", contribution, contribution))
        clipped += int((norms > clip * doc_length).sum())
    return clipped / rows.shape[0]


# Output.


def markdown(rows: Sequence[Row]) -> str:
    lines = [
        "| section | method | setting | sigma | epsilon | docs/s | completion perplexity | perplexity bound "
        "| runs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        speed = f"{np.median(row.docs_per_second):.0f}" if row.docs_per_second else "-"
        lines.append(
            f"| {row.section} | {row.method} | {row.setting} | {row.sigma:.3g} | {eps_text(row.epsilon)} "
            f"| {speed} | {mean_std(row.completion)} | {mean_std(row.bound)} | {len(row.completion)} |"
        )
    return "\n".join(lines) + "\n"


def summary(rows: Sequence[Row]) -> str:
    by_method = {
        row.method: row for row in rows if row.section == "wikipedia" and "article" not in row.setting
    }
    vips = by_method.get("VIPS-LDA (sigma = 0, shuffled passes)")
    sk = by_method.get("scikit-learn online LDA")
    gs = by_method.get("gensim LdaModel")
    if vips is None or sk is None or gs is None:
        return ""
    speed = np.median(vips.docs_per_second) / np.median(sk.docs_per_second)
    gspeed = np.median(vips.docs_per_second) / np.median(gs.docs_per_second)
    gap = np.mean(vips.completion) / np.mean(sk.completion) - 1
    return (
        f"VIPS / scikit-learn: {speed:.2f}x documents per second, completion perplexity {100 * gap:+.1f}%; "
        f"VIPS / gensim: {gspeed:.2f}x documents per second\n"
    )


def plot(rows: Sequence[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12.0, 4.5))
    wiki = [r for r in rows if r.section == "wikipedia"]
    for row in wiki:
        label = row.method + (" (article order)" if "article order" in row.setting else "")
        left.scatter(row.docs_per_second, row.completion, label=label)
    left.set_xscale("log")
    left.set_xlabel("documents per second (1 thread)")
    left.set_ylabel("held-out completion perplexity")
    left.set_title(f"Wikipedia paragraphs, K = {WIKI_TOPICS}, non-private")
    left.legend(fontsize=7)
    left.grid(True, alpha=0.3)
    private = [r for r in rows if r.section == "private"]
    for row in private:
        if row.curve:
            right.plot(range(1, len(row.curve) + 1), row.curve, marker="o", ms=3, label=row.method)
        elif row.completion:
            right.axhline(
                row.completion[0],
                linestyle=":",
                color="k" if "unigram" in row.method else "g",
                label=row.method,
            )
    right.set_xlabel("iteration")
    right.set_ylabel("held-out completion perplexity")
    right.set_title(f"Synthetic, eps = {PRIVATE_EPSILON} (delta = {PRIVATE_DELTA:g}), S/D = {PRIVATE_RATE}")
    right.set_yscale("log")
    right.legend(fontsize=7)
    right.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one seed, a smaller private corpus")
    parser.add_argument("--full", action="store_true", help="only the paper-scale timing run")
    parser.add_argument(
        "--full-worker", action="store_true", help="the paper-scale run as a service job (PostgreSQL, Redis)"
    )
    parser.add_argument(
        "--full-epsilon",
        type=float,
        default=None,
        help="--full: calibrate sigma to this epsilon (default: the paper's sigma 1.24)",
    )
    parser.add_argument(
        "--sklearn-batches",
        type=int,
        default=PRIVATE_ITERATIONS,
        help="--full: scikit-learn online LDA updates timed on minibatches of the same size (0: none)",
    )
    parser.add_argument("--seeds", type=int, default=None, help="wikipedia repeats (5; 1 with --quick)")
    parser.add_argument("--wikipedia-only", action="store_true", help="skip the private section")
    parser.add_argument(
        "--whole-process",
        action="store_true",
        help="only `vips fit --local` as a whole process against scikit-learn's fit (bench.lda_process)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="--whole-process: alternated repeats")
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="only the private sweep: epsilon 1, 2.4, 10, 100 and sigma 0 against the unigram baseline, on "
        "the README's job and on planted-topic corpora of growing size",
    )
    parser.add_argument(
        "--sweep-sizes",
        default=",".join(str(size) for size in SWEEP_SIZES),
        help="--sweep: the synthetic corpora's sizes, comma-separated (default %(default)s; empty: none)",
    )
    parser.add_argument(
        "--sweep-unigram",
        type=int,
        default=0,
        metavar="SEEDS",
        help="only the unigram-block sweep (issue 36): epsilon 0.5-10 and sigma 0 on the LDA rule's "
        "schedule, SEEDS fits each, on the bundled corpus and on planted-topic and stand-in corpora of "
        "--unigram-sizes",
    )
    parser.add_argument(
        "--unigram-sizes",
        default="3000",
        help="--sweep-unigram: the synthetic corpora's sizes, comma-separated (default %(default)s)",
    )
    parser.add_argument(
        "--no-unigram-prior",
        action="store_true",
        help="--sweep-unigram: no public English word-frequency prior (a job's option word_prior=0)",
    )
    parser.add_argument(
        "--unigram-epsilons",
        default=",".join(str(e) for e in UNIGRAM_EPSILONS),
        help="--sweep-unigram: the epsilons, comma-separated (default %(default)s)",
    )
    parser.add_argument("--no-noiseless", action="store_true", help="--sweep-unigram: skip the sigma 0 rows")
    parser.add_argument(
        "--text-csv",
        type=Path,
        action="append",
        default=[],
        help="--sweep-unigram: a public CSV text corpus instead of the bundled one (bench/text_corpus.py: "
        "80/20 split, the 5,000 most frequent training words); repeatable",
    )
    parser.add_argument("--text-column", default="text", help="--text-csv: the column of texts (%(default)s)")
    parser.add_argument(
        "--text-topics",
        default=",".join(str(k) for k in TEXT_TOPICS),
        help="--text-csv: the topics K, comma-separated (default %(default)s)",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if args.whole_process:
        from bench.lda_process import measure, report

        table = report(measure(args.repeats))
        print(table)
        (args.out / "lda_process.md").write_text(
            f"Produced by `python -m bench.lda --whole-process --repeats {args.repeats}`.\n\n{table}\n",
            encoding="utf-8",
        )
        return 0
    if args.sweep_unigram:
        unigram_sizes = [int(size) for size in args.unigram_sizes.split(",") if size.strip()]
        epsilons = [float(e) for e in args.unigram_epsilons.split(",") if e.strip()]
        texts = [text_corpus(path, args.text_column) for path in args.text_csv]
        unigram_rows = unigram_sweep_section(
            args.sweep_unigram,
            unigram_sizes,
            word_prior=not args.no_unigram_prior,
            epsilons=epsilons,
            noiseless=not args.no_noiseless,
            texts=texts,
            text_topics=[int(k) for k in args.text_topics.split(",") if k.strip()],
        )
        table = (
            "Mean gap to the training unigram (in brackets: the private unigram's, at the same epsilon)\n\n"
            f"{sweep_summary(unigram_rows)}\n{sweep_markdown(unigram_rows)}"
        )
        print(table)
        stem = "lda_sweep_text" if texts else "lda_sweep_unigram"
        name = f"{stem}_no_prior.md" if args.no_unigram_prior else f"{stem}.md"
        text_flags = "".join(f" --text-csv {path.name}" for path in args.text_csv)
        if texts:
            text_flags += f" --text-column {args.text_column} --text-topics {args.text_topics}"
        (args.out / name).write_text(
            f"Produced by `python -m bench.lda --sweep-unigram {args.sweep_unigram} --unigram-sizes "
            f"{args.unigram_sizes} --unigram-epsilons {args.unigram_epsilons}{text_flags}"
            f"{' --no-unigram-prior' if args.no_unigram_prior else ''}"
            f"{' --no-noiseless' if args.no_noiseless else ''}`.\n\n{table}",
            encoding="utf-8",
        )
        return 0
    if args.sweep:
        sizes = [int(size) for size in args.sweep_sizes.split(",") if size.strip()]
        table = sweep_markdown(sweep_section(sizes))
        elapsed = time.perf_counter() - start
        print(table)
        print(f"({elapsed:.0f} s)")
        (args.out / "lda_sweep.md").write_text(
            f"Produced by `python -m bench.lda --sweep --sweep-sizes {','.join(map(str, sizes))}` in "
            f"{elapsed:.0f} s.\n\n{table}",
            encoding="utf-8",
        )
        return 0
    if args.full_worker:
        import tempfile

        with tempfile.TemporaryDirectory() as work:
            table = full_worker_mode(Path(work))
        print(table)
        (args.out / "lda_full_worker.md").write_text(
            f"Produced by `python -m bench.lda --full-worker`.\n\n{table}", encoding="utf-8"
        )
        return 0
    if args.full:
        sigma = FULL_SIGMA
        if args.full_epsilon is not None:
            sigma = calibrate_sigma(
                args.full_epsilon, FULL_BATCH, FULL_SETTING.documents, PRIVATE_ITERATIONS, PRIVATE_DELTA
            )
        table = full_mode(sigma, args.sklearn_batches)
        print(table)
        (args.out / "lda_full.md").write_text(
            f"Produced by `python -m bench.lda --full`.\n\n{table}", encoding="utf-8"
        )
        return 0
    seeds = args.seeds if args.seeds is not None else (1 if args.quick else 5)
    rows = wikipedia_section(seeds, article_order=not args.quick)
    if args.wikipedia_only:
        table = markdown(rows)
        print(table)
        print(summary(rows))
        (args.out / "lda_wikipedia.md").write_text(
            f"Produced by `python -m bench.lda --wikipedia-only`.\n\n{table}\n{summary(rows)}",
            encoding="utf-8",
        )
        return 0
    private_rows, info = private_section(args.quick, repeats=1 if args.quick else 2)
    rows += private_rows
    elapsed = time.perf_counter() - start
    table = markdown(rows)
    notes = (
        f"Private section: sigma {info['sigma_ma']:.3f} (moments accountant, eps "
        f"{info['epsilon_ma']:.3f}) and {info['sigma_strong']:.3f} (strong composition at eps "
        f"{info['strong_epsilon_of_strong_sigma']:.3f}; the moments accountant charges it "
        f"{info['ma_epsilon_of_strong_sigma']:.3f}); documents clipped at a = {CLIP}: "
        f"{100 * info['clipped_fraction']:.0f}% (final topics, 2,000 training documents).\n"
    )
    print(table)
    print(summary(rows) + notes)
    print(f"({elapsed:.0f} s)")
    command = (
        "python -m bench.lda"
        + (" --quick" if args.quick else "")
        + (f" --seeds {args.seeds}" if args.seeds is not None else "")
    )
    stem = "lda_quick" if args.quick else "lda"
    (args.out / f"{stem}.md").write_text(
        f"Produced by `{command}` in {elapsed:.0f} s.\n\n{table}\n{summary(rows)}{notes}", encoding="utf-8"
    )
    plot(rows, args.out / f"{stem}.png")
    log(f"wrote {args.out / (stem + '.md')} and {args.out / (stem + '.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
