"""Release times of neighbouring corpora (issue 52 item 9): the attack's timing channel, unpadded and
padded (privacy_wall.timing).

Two corpora of S documents differ in one: a one-word document, or one of 500 distinct words. For each
(S, K) of the attack, R fresh gates release once on each corpus in turn, unpadded (the compute's own time,
as an in-process fit has it) and padded (the service's gate: what the analyst sees, from the charge's
commit to the release, each with its own calibration as each job has). Reports the medians, the
difference the wide document makes, and the padded slot counts k.
Then the price: one release on the bundled Wikipedia corpus (S = N), unpadded and padded, at K 10 and 50.

    python -m bench.release_timing [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import scipy.sparse as sp

from privacy_wall import gate as gate_module
from privacy_wall.data.store import InMemoryBowStore
from privacy_wall.gate import Gate
from privacy_wall.ledger.base import Charge, InMemoryLedger
from privacy_wall.queries.lda import PARAM, LdaQuery
from vips.datasets.wikipedia import load_wikipedia

V = 5_000
#: The attack's settings: (documents S, topics K).
ATTACK = ((500, 20), (40, 50))


def neighbours(size: int, seed: int = 5) -> tuple[sp.csr_array, sp.csr_array]:
    """S documents of 20-60 distinct words, the first replaced by 1 word, or by 500 distinct words."""
    rng = np.random.default_rng(seed)
    rows = [rng.choice(V, size=int(rng.integers(20, 61)), replace=False) for _ in range(size)]

    def corpus(first: np.ndarray) -> sp.csr_array:
        documents = [first, *rows[1:]]
        indptr = np.cumsum([0] + [len(d) for d in documents])
        data = np.ones(int(indptr[-1]), dtype=np.int32)
        return sp.csr_array((data, np.concatenate(documents), indptr), shape=(size, V))

    return corpus(np.array([3])), corpus(np.arange(500))


class _StampedLedger(InMemoryLedger):
    """A ledger that notes when each commit ended: where a release's visible time starts."""

    def __init__(self) -> None:
        super().__init__(delta=1e-5)
        self.committed = 0.0

    def commit(self, charge: Charge) -> None:
        super().commit(charge)
        self.committed = time.perf_counter()


def release_time(
    counts: sp.csr_array, query: LdaQuery, params: dict[str, np.ndarray], padded: bool
) -> tuple[float, int | None]:
    """A fresh gate's first release (a job's: padded, its own calibration): the seconds from its charge's
    commit to its return, and the slot count it was held for (None unpadded)."""
    held: list[int] = []
    real_hold = gate_module.hold

    def spy(started: float, slot: float) -> int:
        held.append(real_hold(started, slot))
        return held[-1]

    ledger = _StampedLedger()
    gate = Gate(InMemoryBowStore("c", counts), ledger, padded=padded)
    gate_module.hold = spy  # type: ignore[assignment]
    try:
        gate.release(query, params, job_id="b", iteration=1, sigma=1.0, batch_size=counts.shape[0])
        seconds = time.perf_counter() - ledger.committed
    finally:
        gate_module.hold = real_hold  # type: ignore[assignment]
    return seconds, held[0] if held else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    print("| S | K | gate | one-word (ms) | 500-word (ms) | difference | slots k |")
    print("|---|---|---|---|---|---|---|")
    for size, topics in ATTACK:
        query = LdaQuery(topics, doc_length=500)
        params = {PARAM: np.log(np.random.default_rng(0).dirichlet(np.ones(V), size=topics))}
        short, wide = neighbours(size)
        for padded in (False, True):
            times: dict[str, list[float]] = {"short": [], "wide": []}
            slots: set[int | None] = set()
            for _ in range(args.repeats):  # the corpora alternate: a change of the machine's load hits both
                for name, counts in (("short", short), ("wide", wide)):
                    seconds, k = release_time(counts, query, params, padded)
                    times[name].append(seconds)
                    slots.add(k)
            ma, mb = (statistics.median(times[name]) * 1e3 for name in ("short", "wide"))
            held = f"{sorted(k for k in slots if k is not None)}" if padded else "-"
            gate = "padded" if padded else "unpadded"
            change = 100 * (mb / ma - 1)
            print(f"| {size} | {topics} | {gate} | {ma:.1f} | {mb:.1f} | {change:+.1f}% | {held} |")
    corpus = load_wikipedia().train
    print("\nWikipedia (S = N = {}, V {}): seconds per release".format(*corpus.shape))
    print("| K | unpadded | padded |")
    print("|---|---|---|")
    for topics in (10, 50):
        query = LdaQuery(topics, doc_length=500, unigram_share=0.97, unigram_clip=3.0)
        params = {PARAM: np.log(np.random.default_rng(0).dirichlet(np.ones(corpus.shape[1]), size=topics))}
        unpadded, padded = (
            statistics.median(release_time(corpus, query, params, flag)[0] for _ in range(3))
            for flag in (False, True)
        )
        print(f"| {topics} | {unpadded:.3f} | {padded:.3f} |")


if __name__ == "__main__":
    main()
