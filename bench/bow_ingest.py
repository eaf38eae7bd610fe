"""Bag-of-words ingest at scale (issue 22): `vips data ingest --kind bow` of a synthetic UCI docword file in a
child process (wall seconds and its peak RSS), into an embedded store (SQLite under a fresh VIPS_HOME);
then the strict reader alone on the bundled corpus (what `vips fit --local` reads).

The synthetic file: D documents of 100 distinct words each (V = 10,000, sorted word ids, counts from a
geometric distribution), sorted by docID as UCI files are; about 12 bytes a line.

    python -m bench.bow_ingest                          # D = 200,000 and 1,000,000
    python -m bench.bow_ingest --documents 200000       # one D (repeatable)
    python -m bench.bow_ingest --parsers                # pyarrow against numpy on one block
    python -m bench.bow_ingest --fit 5                  # the whole `vips fit --local` LDA process, 5 times
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv

WORDS = 10_000
PER_DOCUMENT = 100
#: The child's peak RSS in kB, measured by a wrapper process that waits for it (RUSAGE_CHILDREN).
_PEAK = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def write_docword(path: Path, documents: int, seed: int = 0) -> None:
    """`documents` documents of PER_DOCUMENT distinct words, written 10,000 documents at a time."""
    rng = np.random.default_rng(seed)
    stride = WORDS // PER_DOCUMENT
    options = pa_csv.WriteOptions(include_header=False, delimiter=" ", quoting_style="none")
    with path.open("wb") as out:
        out.write(f"{documents}\n{WORDS}\n{documents * PER_DOCUMENT}\n".encode())
        for start in range(0, documents, 10_000):
            n = min(10_000, documents - start)
            words = np.arange(PER_DOCUMENT) * stride + rng.integers(0, stride, size=(n, PER_DOCUMENT)) + 1
            counts = rng.geometric(0.5, size=(n, PER_DOCUMENT))
            ids = np.repeat(np.arange(start + 1, start + n + 1), PER_DOCUMENT)
            table = pa.table({"doc": ids, "word": words.ravel(), "count": counts.ravel()})
            pa_csv.write_csv(table, out, options)


def ingest(documents: int, folder: Path) -> dict[str, float]:
    """Seconds and peak RSS of `vips data ingest` of a fresh synthetic file into a fresh store."""
    docword, vocab = folder / f"docword-{documents}.txt", folder / "vocab.txt"
    write_docword(docword, documents)
    vocab.write_text("".join(f"w{j}\n" for j in range(WORDS)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIPS_")}
    env["VIPS_HOME"] = str(folder / f"home-{documents}")
    vips = [sys.executable, "-m", "vips.cli"]
    subprocess.run([*vips, "migrate", "all"], env=env, check=True, capture_output=True)
    argv = [*vips, "data", "ingest", "docs", "--kind", "bow", "--input", str(docword), "--vocab", str(vocab)]
    argv.append("--vocab-is-public")  # the synthetic word list is public
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, *argv], env=env, text=True, capture_output=True, check=False
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
        raise SystemExit(f"ingest of {documents} documents failed")
    result = {
        "documents": documents,
        "file_mb": docword.stat().st_size / 1e6,
        "ingest_s": seconds,
        "rss_mb": int(done.stdout.strip().splitlines()[-1]) / 1024,
    }
    docword.unlink()
    return result


def parsers(folder: Path, repeats: int = 3) -> dict[str, float]:
    """Best of `repeats` seconds of each fast parser of privacy_wall.data.docword on one block of a synthetic
    file (DOCWORD_BLOCK_BYTES of whole lines), and of pyarrow's import in a fresh interpreter."""
    from privacy_wall.data import docword as reader

    docword = folder / "parsers.txt"
    write_docword(docword, 20_000)
    data = docword.read_bytes()
    docword.unlink()
    start = data.index(b"\n", data.index(b"\n", data.index(b"\n") + 1) + 1) + 1
    block = data[start : data.rindex(b"\n", start, start + reader.DOCWORD_BLOCK_BYTES) + 1]
    result = {"block_mb": len(block) / 1e6}
    for name, with_numpy in (("pyarrow", False), ("numpy", True)):
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            lines = block.count(b"\n")
            assert reader._parse_fast(block, lines, reader.MAX_LINE_BYTES, with_numpy=with_numpy) is not None
            times.append(time.perf_counter() - started)
        result[name] = min(times)
    code = "import time, numpy; t = time.perf_counter(); import pyarrow.csv; print(time.perf_counter() - t)"
    imports = [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
        for _ in range(3)
    ]
    result["pyarrow_import"] = min(imports)
    return result


def bundled_read(repeats: int = 5) -> float:
    """Best of `repeats` seconds of `read_docword` on the bundled Wikipedia training corpus (D = 2,786)."""
    from privacy_wall.data.docword import read_docword, read_vocabulary
    from vips.datasets.wikipedia import load_wikipedia, write_bag_of_words

    corpus = load_wikipedia()
    with tempfile.TemporaryDirectory() as work:
        docword, vocab = Path(work) / "docword.txt", Path(work) / "vocab.txt"
        write_bag_of_words(corpus.train, corpus.vocabulary, docword, vocab)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            read_docword(docword, read_vocabulary(vocab))
            times.append(time.perf_counter() - started)
    return min(times)


def fit_process(repeats: int = 5) -> list[float]:
    """Seconds of the whole `vips fit --local` LDA process of bench/lda_process.py on the bundled corpus,
    run as `python -m vips.cli` (the code of the current directory: run it from each tree to compare), one
    BLAS thread, bytecode cached in a temporary folder and warmed by one run first."""
    from bench.lda_process import ONE_THREAD, vips_command
    from vips.datasets.wikipedia import load_wikipedia, write_bag_of_words

    corpus = load_wikipedia()
    with tempfile.TemporaryDirectory() as work:
        docword, vocab = Path(work) / "docword.txt", Path(work) / "vocab.txt"
        write_bag_of_words(corpus.train, corpus.vocabulary, docword, vocab)
        command = vips_command(
            docword, vocab, round(corpus.train.shape[0] / 10), Path(work) / "posterior.json"
        )
        command = [sys.executable, "-m", "vips.cli", *command[command.index("fit") :]]
        env = {**os.environ, **ONE_THREAD, "PYTHONPYCACHEPREFIX": str(Path(work) / "pycache")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        times = []
        for _ in range(repeats + 1):
            started = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, env=env)
            times.append(time.perf_counter() - started)
        return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--documents", type=int, action="append", help="D (repeatable); default 200,000 and 1,000,000"
    )
    parser.add_argument("--no-bundled", action="store_true", help="skip reading the bundled corpus")
    parser.add_argument("--parsers", action="store_true", help="only time the fast parsers on one block")
    parser.add_argument(
        "--fit", type=int, metavar="R", help="only time the whole `vips fit --local` LDA process R times"
    )
    args = parser.parse_args()
    if args.fit:
        times = fit_process(args.fit)
        print(f"vips fit --local, LDA on the bundled corpus: {' '.join(f'{t:.2f}' for t in times)} s")
        return
    if args.parsers:
        with tempfile.TemporaryDirectory() as folder:
            r = parsers(Path(folder))
        print(
            f"one block of {r['block_mb']:.1f} MB: pyarrow {r['pyarrow']:.3f} s, numpy {r['numpy']:.3f} s; "
            f"import pyarrow.csv {r['pyarrow_import']:.3f} s"
        )
        return
    print("D entries file_MB ingest_s peak_RSS_MB", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        for documents in args.documents or [200_000, 1_000_000]:
            r = ingest(documents, Path(folder))
            print(
                f"{documents:,} {documents * PER_DOCUMENT:,} {r['file_mb']:.0f} {r['ingest_s']:.1f} "
                f"{r['rss_mb']:.0f}",
                flush=True,
            )
    if not args.no_bundled:
        print(f"read_docword, bundled corpus (D = 2,786): {bundled_read():.3f} s (best of 5)")


if __name__ == "__main__":
    main()
