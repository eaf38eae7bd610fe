"""How far a job's posterior still moves, iteration by iteration, recomputed from its releases alone.

Post-processing of the stored noisy releases and the job's public options (nothing behind the wall is
read): the releases are replayed through the part of the algorithm's public update that the service can
redo without the worker's models (the import contract keeps them apart; the loop's step size is the
models' facts', vips.models.spec.step_size):

- VIPS (every model) and DP-SEP: the M-step's averaging of the natural parameters,
  nu_t = (1 - g_t) nu_(t-1) + g_t N s_t with g_t = rho_t = (tau0 + t)^-kappa (DP-SEP: damping * rho_t;
  1 in exact batch mode, S >= N at sigma 0, as vips.runner does). The signal is the M-step's update
  relative to what it updates, ||nu_t - nu_(t-1)|| / ||nu_t|| over the data part of nu (N times the
  averaged releases; the prior's constant part is left out, which only ever makes the ratio larger).
- DPVI: AdaGrad on the ELBO's gradient (N g - m / v, N g_s - exp(2 s) / v + 1, as vips.models.blr.dpvi),
  and the signal is how far the posterior mean moved in posterior standard deviations (root mean square
  over the coefficients of (m_t - m_(t-1)) / sd_t).

Each trace is cached per job with the replay's state, so a running job's page decodes only the releases
that are new since its last view, and each drawn plot per (job, iterations released).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import Engine, Row, func, select

from control.planning.options import DPVI_DEFAULTS
from control.store.models import releases
from control.store.release_arrays import decode_arrays
from privacy_wall.sqlengine import reading
from vips.models.spec import step_size

#: Jobs whose replays (a few arrays each, LDA's the size of one release) are kept.
CACHED_JOBS = 32


@dataclass(frozen=True)
class Signal:
    """What a trace measures: its axis label and the caption under its plot, in words."""

    label: str
    caption: str


NATURAL = Signal(
    "how far the posterior moved (% of its size)",
    "Each point is how much iteration t's update moved the posterior's natural parameters, as a "
    "percentage of their size, recomputed from the released statistics by the M-step's own averaging "
    "(step size rho_t = (tau0 + t)^-kappa). It falls as the fit settles and flattens once later releases "
    "no longer move it; the noise in each release keeps it from reaching zero (at sigma 0 it may).",
)
DPVI = Signal(
    "how far the posterior mean moved (standard deviations)",
    "Each point is how far iteration t's AdaGrad step moved the posterior mean, in posterior standard "
    "deviations (root mean square over the coefficients), recomputed from the released gradients. It "
    "falls as the fit settles and flattens once the steps no longer move it; the noise in each release "
    "keeps it from reaching zero (at sigma 0 it may).",
)


def signal_of(algorithm: str) -> Signal:
    """What a job's trace measures, by its algorithm."""
    return DPVI if algorithm == "dpvi" else NATURAL


@dataclass
class Trace:
    """The signal at each iteration after the first (iteration, value), and the replay's state after
    the last release read."""

    signal: Signal
    iterations: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    last: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    #: Held while releases are replayed into this trace: two views of one job never decode the same
    #: releases twice, and views of other jobs do not wait for it.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


def _step(options: dict[str, Any], t: int, exact_batch: bool) -> float:
    """The loop's rho_t (vips.models.spec.step_size; 1 in exact batch mode, as vips.runner)."""
    if exact_batch:
        return 1.0
    return step_size(t, float(options.get("tau0", 0.0)), float(options.get("kappa", 1.0)))


def _relative(change: float, size: float) -> float:
    return 100.0 * change / size if size > 0 else 0.0


def _average(trace: Trace, job: Row[Any], population: int, t: int, arrays: dict[str, np.ndarray]) -> None:
    """VIPS and DP-SEP: nu_t = (1 - g) nu_(t-1) + g N s_t per released block; the relative update."""
    exact_batch = job.batch_size >= population and job.sigma == 0
    gain = _step(dict(job.options), t, exact_batch)
    if job.algorithm == "dpsep":
        gain *= float(dict(job.options).get("damping", 1.0))
    change = size = 0.0
    for name, value in arrays.items():
        released = population * np.asarray(value, dtype=np.float64).ravel()
        previous = trace.state.get(name)
        if previous is None or previous.shape != released.shape:
            previous = np.zeros_like(released)
        current = (1.0 - gain) * previous + gain * released
        change += float(np.sum((current - previous) ** 2))
        size += float(np.sum(current**2))
        trace.state[name] = current
    if t > 1:
        trace.iterations.append(t)
        trace.values.append(_relative(math.sqrt(change), math.sqrt(size)))


def _adagrad(trace: Trace, job: Row[Any], population: int, t: int, arrays: dict[str, np.ndarray]) -> None:
    """DPVI: one AdaGrad step from the released gradient g = (g_m, g_s); the mean's move in sds."""
    options = dict(job.options)
    prior = float(options.get("prior_variance", DPVI_DEFAULTS["prior_variance"]))
    rate = float(options.get("learning_rate", DPVI_DEFAULTS["learning_rate"]))
    (released,) = (np.asarray(v, dtype=np.float64).ravel() for v in arrays.values())
    d = released.shape[0] // 2
    state = trace.state
    if not state:
        zeros = np.zeros(d)
        state.update(mean=zeros, log_std=np.full(d, 0.5 * math.log(prior)), g_mean=zeros, g_log_std=zeros)
    mean, log_std = state["mean"], state["log_std"]
    grad_mean = population * released[:d] - mean / prior
    grad_log_std = population * released[d:] - np.exp(2.0 * log_std) / prior + 1.0
    for key, parameter, grad, accumulated in (
        ("mean", mean, grad_mean, "g_mean"),
        ("log_std", log_std, grad_log_std, "g_log_std"),
    ):
        total = state[accumulated] + grad * grad
        root = np.sqrt(total)
        state[key] = parameter + rate * np.divide(grad, root, out=np.zeros_like(grad), where=root > 0)
        state[accumulated] = total
    moved = (state["mean"] - mean) / np.exp(state["log_std"])
    trace.iterations.append(t)
    trace.values.append(float(np.sqrt(np.mean(moved**2))) if d else 0.0)


@dataclass(frozen=True)
class Curve:
    """A snapshot of a trace: the signal at iterations 2.. (DPVI: 1..) up to the last release read."""

    signal: Signal
    iterations: tuple[int, ...]
    values: tuple[float, ...]
    last: int


class _Traces:
    """Each job's trace with its replay state, least recently used out first, safe across threads: the
    cache's lock guards the dictionary only, each trace's own lock its replay."""

    def __init__(self, size: int = CACHED_JOBS) -> None:
        self._items: OrderedDict[str, Trace] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def update(self, engine: Engine, job: Row[Any], population: int) -> Curve:
        with self._lock:
            trace = self._items.get(job.id)
            if trace is None:
                trace = self._items[job.id] = Trace(signal_of(job.algorithm))
            self._items.move_to_end(job.id)
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        step = _adagrad if job.algorithm == "dpvi" else _average
        with trace.lock:
            try:
                with reading(engine) as conn:
                    rows = conn.execute(
                        select(releases.c.iteration, releases.c.arrays)
                        .where(releases.c.job_id == job.id, releases.c.iteration > trace.last)
                        .order_by(releases.c.iteration)
                    )
                    for iteration, blob in rows:  # one release decoded at a time
                        step(trace, job, population, int(iteration), decode_arrays(blob))
                        trace.last = int(iteration)
            except BaseException:  # a step may have stopped half-way: the next view replays from scratch
                with self._lock:
                    if self._items.get(job.id) is trace:
                        del self._items[job.id]
                raise
            return Curve(trace.signal, tuple(trace.iterations), tuple(trace.values), trace.last)


_traces = _Traces()


def released_count(engine: Engine, job_id: str) -> int:
    """How many releases the job has stored (the key of its cached plot)."""
    with reading(engine) as conn:
        count: int = conn.execute(
            select(func.count()).select_from(releases).where(releases.c.job_id == job_id)
        ).scalar_one()
    return count


def curve(engine: Engine, job: Row[Any], population: int) -> Curve:
    """The job's convergence curve up to its last stored release (job: its row of the jobs table;
    population: its dataset's N), replaying only the releases its cached trace has not read."""
    return _traces.update(engine, job, population)


def clear() -> None:
    """Forget every cached trace (benchmarks measure the first request with this)."""
    _traces.clear()
