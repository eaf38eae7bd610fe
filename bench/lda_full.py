"""bench.lda's --full (the paper's scale: seconds per iteration and peak RSS beside scikit-learn) and the
worker-process variant (bench/lda.py says what each measures)."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from bench.lda_common import (
    CLIP,
    DOC_LENGTH,
    FULL_BATCH,
    FULL_PIECES,
    FULL_SETTING,
    FULL_SIGMA,
    INNER_ITERATIONS,
    PRIVATE_DELTA,
    PRIVATE_ITERATIONS,
    PRIVATE_KAPPA,
    PRIVATE_TAU0,
    Counts,
    Evaluation,
    SyntheticSetting,
    log,
    synthetic_data,
    vips_fit,
)
from privacy_wall.data.store import InMemoryBowStore
from vips.datasets.synthetic_lda import generate_corpus, planted_topics
from vips.models.lda.model import (
    LdaState,
    unigram_perplexity,
)

# (c) The paper's scale.


def peak_rss_gb() -> float:
    """Peak resident set size of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def full_corpus(setting: SyntheticSetting) -> tuple[Counts, Evaluation]:
    """The --full training corpus (FULL_PIECES pieces of planted-topic documents, seeds 1, 2, ...; int32
    CSR, built array by array) and its held-out evaluation set (seed 0 of the test generator's stream)."""
    truth = planted_topics(setting.topics, setting.vocabulary, seed=0)
    sizes = [len(part) for part in np.array_split(np.arange(setting.documents), FULL_PIECES)]
    pieces = [
        sp.csr_array(
            generate_corpus(
                size, truth, mean_length=setting.mean_length, alpha=setting.alpha, seed=1 + piece
            ).counts
        )
        for piece, size in enumerate(sizes)
    ]
    offsets = np.cumsum([0] + [int(piece.nnz) for piece in pieces])
    indptr = np.concatenate(
        [[0]] + [np.asarray(piece.indptr[1:], dtype=np.int64) + offsets[i] for i, piece in enumerate(pieces)]
    )
    data = np.empty(int(offsets[-1]), dtype=np.int32)
    indices = np.empty(int(offsets[-1]), dtype=np.int32)
    for i in range(len(pieces)):
        piece, pieces[i] = pieces[i], sp.csr_array((1, 1))  # released as soon as it is copied
        data[offsets[i] : offsets[i + 1]] = piece.data
        indices[offsets[i] : offsets[i + 1]] = piece.indices
        del piece
    counts = sp.csr_array((data, indices, indptr), shape=(setting.documents, setting.vocabulary))
    test = generate_corpus(
        setting.test_documents, truth, mean_length=setting.mean_length, alpha=setting.alpha, seed=2
    )
    return counts, Evaluation.of(test.counts, 1.0 / setting.topics)


def sklearn_minibatch_seconds(
    counts: Counts, topics: int, batches: int, seed: int = 0
) -> tuple[list[float], list[float]]:
    """Seconds of each of scikit-learn's online LDA updates (`partial_fit`, learning_method "online") on
    `batches` minibatches of FULL_BATCH documents drawn as VIPS draws them (uniformly, without replacement,
    independently per iteration), with VIPS's step sizes (learning_offset tau0, learning_decay kappa),
    total_samples D and alpha = eta = 1/K; one BLAS thread. Each update includes the row selection.
    Returns wall and CPU seconds per update."""
    from sklearn.decomposition import LatentDirichletAllocation as SkLda

    model = SkLda(
        n_components=topics,
        learning_method="online",
        batch_size=FULL_BATCH,
        learning_offset=PRIVATE_TAU0,
        learning_decay=PRIVATE_KAPPA,
        total_samples=counts.shape[0],
        doc_topic_prior=1.0 / topics,
        topic_word_prior=1.0 / topics,
        random_state=seed,
    )
    matrix = sp.csr_matrix(counts)
    rng = np.random.default_rng(seed)
    seconds: list[float] = []
    cpu: list[float] = []
    with threadpool_limits(1):
        for t in range(batches):
            start, start_cpu = time.perf_counter(), time.process_time()
            rows = np.sort(rng.choice(counts.shape[0], size=FULL_BATCH, replace=False))
            model.partial_fit(matrix[rows])
            seconds.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
            log(f"  scikit-learn minibatch {t + 1}: {seconds[-1]:.1f} s ({cpu[-1]:.1f} s CPU)")
    return seconds, cpu


def full_mode(sigma: float = FULL_SIGMA, sklearn_batches: int = PRIVATE_ITERATIONS) -> str:
    """The paper's scale in process: corpus, store, 20 private releases through the gate with their M-steps
    (one BLAS thread), then scikit-learn's online LDA on `sklearn_batches` minibatches of the same size
    from the same corpus (0: skipped). Peak RSS is the whole process's (corpus generation included) when
    the fit ends, before scikit-learn runs."""
    setting = FULL_SETTING
    start = time.perf_counter()
    train, evaluation = full_corpus(setting)
    generated = time.perf_counter() - start
    generation_rss = peak_rss_gb()
    log(f"full: generated D = {setting.documents} (nnz {train.nnz}) in {generated:.0f} s")
    start = time.perf_counter()
    store = InMemoryBowStore("full", train, public=False)
    stored = time.perf_counter() - start
    times: list[float] = []
    cpu: list[float] = []
    last, last_cpu = time.perf_counter(), time.process_time()

    def tick(t: int, _state: LdaState) -> None:
        nonlocal last, last_cpu
        now, now_cpu = time.perf_counter(), time.process_time()
        times.append(now - last)
        cpu.append(now_cpu - last_cpu)
        log(
            f"  iteration {t}: {now - last:.2f} s ({now_cpu - last_cpu:.2f} s CPU), "
            f"peak RSS {peak_rss_gb():.2f} GB"
        )
        last, last_cpu = now, now_cpu

    load = " / ".join(f"{value:.1f}" for value in os.getloadavg())
    with threadpool_limits(1):
        fit = vips_fit(
            train,
            topics=setting.topics,
            sigma=sigma,
            batch_size=FULL_BATCH,
            iterations=PRIVATE_ITERATIONS,
            doc_length=DOC_LENGTH,
            clip=CLIP,
            tau0=PRIVATE_TAU0,
            kappa=PRIVATE_KAPPA,
            delta=PRIVATE_DELTA,
            seed=0,
            on_iteration=tick,
            store=store,
        )
    fit_rss = peak_rss_gb()
    vips_iteration = float(np.median(times))
    sklearn_seconds, sklearn_cpu = sklearn_minibatch_seconds(train, setting.topics, sklearn_batches)
    completion = evaluation.completion(fit.state.lam)
    unigram = unigram_perplexity(train, evaluation.held_out)
    lines = [
        "| quantity | value |",
        "|---|---|",
        f"| corpus | D = {setting.documents:,}, V = {setting.vocabulary:,}, K = {setting.topics}, "
        f"{train.nnz:,} non-zeros, mean length {setting.mean_length:g} |",
        f"| schedule | S = {FULL_BATCH:,}, T = {PRIVATE_ITERATIONS}, N_w = {DOC_LENGTH}, a = {CLIP}, "
        f"sigma = {sigma:.4g}, {INNER_ITERATIONS} inner iterations, one thread |",
        f"| epsilon (delta = {PRIVATE_DELTA:g}) | {fit.epsilon:.3f} |",
        f"| corpus generation | {generated:.0f} s (peak RSS {generation_rss:.2f} GB) |",
        f"| store construction (bound checks) | {stored:.1f} s |",
        f"| fit wall time ({PRIVATE_ITERATIONS} releases + M-steps) | {fit.seconds:.1f} s |",
        f"| VIPS per iteration (median; load average at start {load}) | {vips_iteration:.2f} s "
        f"({np.median(cpu):.2f} s of CPU, both threads) |",
        f"| peak RSS (whole process, at the fit's end) | {fit_rss:.2f} GB |",
    ]
    if sklearn_seconds:
        median, median_cpu = float(np.median(sklearn_seconds)), float(np.median(sklearn_cpu))
        lines += [
            f"| scikit-learn online LDA per minibatch of {FULL_BATCH:,} (median of {len(sklearn_seconds)}) "
            f"| {median:.2f} s ({median_cpu:.2f} s of CPU) |",
            f"| ratio (scikit-learn / VIPS, seconds per iteration) | {median / vips_iteration:.2f}x "
            f"(CPU: {median_cpu / float(np.median(cpu)):.2f}x) |",
        ]
    lines.append(f"| held-out completion perplexity | {completion:.1f} (unigram {unigram:.1f}) |")
    return "\n".join(lines) + "\n"


def worker_peak_rss_gb(pid: int) -> float:
    """Peak resident set size (VmHWM) of another process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    raise RuntimeError("no VmHWM in /proc: peak RSS needs Linux")


def full_worker_mode(work: Path) -> str:
    """The full configuration as a service job: the corpus ingested into PostgreSQL (the sensitive
    database), the job submitted over HTTP and run by a real `vips worker` (Celery, Redis, the gate over
    the database store, the ledger), as tests/e2e.py starts them. Wall time from the job's own timestamps;
    peak RSS of the worker process."""
    from datetime import datetime

    from privacy_wall.data.docword import BagOfWords
    from privacy_wall.data.ingest import ingest_bag_of_words
    from privacy_wall.sqlengine import create_db_engine
    from service.http.client import VipsClient
    from tests.e2e import production_service

    setting = FULL_SETTING
    start = time.perf_counter()
    data = synthetic_data(setting)
    log(f"full (worker): generated D = {setting.documents} (nnz {data.train.nnz}) in "
        f"{time.perf_counter() - start:.0f} s")  # fmt: skip
    train = data.train
    corpus = BagOfWords(
        np.asarray(train.indptr, dtype=np.int64),
        np.asarray(train.indices, dtype=np.int32),
        np.asarray(train.data, dtype=np.int32),
        tuple(f"w{v}" for v in range(setting.vocabulary)),
    )
    with production_service(work) as service:
        control = create_db_engine(service.env["VIPS_CONTROL_DATABASE_URL"])
        sensitive = create_db_engine(service.env["VIPS_SENSITIVE_DATABASE_URL"])
        start = time.perf_counter()
        # Synthetic, so marked public: the paper's delta 1e-4 is not below 1/D, which a private dataset's
        # budget refuses (docs/design.md, section 3, delta policy); at sigma > 0 the job runs as on
        # private data.
        ingest_bag_of_words(control=control, sensitive=sensitive, name="full", corpus=corpus, public=True)
        ingested = time.perf_counter() - start
        log(f"  ingested into PostgreSQL in {ingested:.0f} s")
        custodian, analyst = service.key("custodian", "full"), service.key("analyst")
        service.vips(
            "budget", "set", "full", "--epsilon", "3", "--delta", f"{PRIVATE_DELTA:g}", key=custodian
        )
        worker_pid = service.processes["worker"].pid
        rss_before = worker_peak_rss_gb(worker_pid)
        options = {"topics": float(setting.topics), "doc_length": float(DOC_LENGTH), "clip": CLIP,
                   "tau0": PRIVATE_TAU0, "kappa": PRIVATE_KAPPA}  # fmt: skip
        with VipsClient(service.url, analyst) as api:
            job = api.submit_job(dataset="full", model="lda", iterations=PRIVATE_ITERATIONS,
                                 batch_size=FULL_BATCH, sigma=FULL_SIGMA, options=options)  # fmt: skip
            done = api.wait(job["id"], interval=2.0, timeout=3600)
            if done["status"] != "succeeded":
                raise RuntimeError(f"the job ended {done['status']}: {done.get('error')}")
            posterior = api.posterior(job["id"])
        peak = worker_peak_rss_gb(worker_pid)
        control.dispose()
        sensitive.dispose()
    seconds = (
        datetime.fromisoformat(done["finished_at"]) - datetime.fromisoformat(done["created_at"])
    ).total_seconds()
    lam = np.asarray(posterior["lambda"], dtype=np.float64)
    completion = data.evaluation.completion(lam)
    unigram = unigram_perplexity(data.train, data.evaluation.held_out)
    lines = [
        "| quantity | value |",
        "|---|---|",
        f"| corpus | D = {setting.documents:,}, V = {setting.vocabulary:,}, K = {setting.topics}, "
        f"{data.train.nnz:,} non-zeros, in PostgreSQL (ingested in {ingested:.0f} s) |",
        f"| schedule | S = {FULL_BATCH:,}, T = {PRIVATE_ITERATIONS}, N_w = {DOC_LENGTH}, a = {CLIP}, "
        f"sigma = {FULL_SIGMA} |",
        f"| epsilon spent (delta = {PRIVATE_DELTA:g}) | {done['epsilon_spent']:.3f} |",
        f"| job wall time (submit to finished, in the worker) | {seconds:.0f} s ({seconds / 60:.1f} min) |",
        f"| worker peak RSS | {peak:.2f} GB (idle worker before the job: {rss_before:.2f} GB) |",
        f"| held-out completion perplexity | {completion:.1f} (unigram {unigram:.1f}) |",
    ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------------
