"""The benchmark harness: cases, the interleaved timer, and the reports.

A *suite* is a module ``benchmarks/bench_<name>.py`` with a ``cases()`` function
returning a list of :class:`Case`. Each case times up to three implementations of
the same job on the same data:

- ``"torchdict"``  -- this project,
- ``"tensordict"`` -- upstream tensordict (a benchmark-only dependency),
- ``"floor"``      -- the hand-written dict-of-tensors code doing the same job.

A case gives, per label, a *prepare* function ``prepare(data) -> run``: it is
called outside the timed region with whatever ``case.setup()`` returned (``None``
without a setup) and returns the zero-argument callable that is timed. A
prepare that raises ``ImportError`` drops that column (library not installed);
any other exception is reported as an error in the table and the run goes on.

Example (see benchmarks/README.md for the whole API)::

    from _harness import Case, for_libraries

    def cases():
        def setup():
            return {"a": torch.zeros(16, 3)}
        def floor(data):
            return lambda: data["a"]
        def library(lib, data):
            td = lib.TensorDict(data, batch_size=[16])
            return lambda: td["a"]
        return [Case("get", setup=setup, target="<= 2x floor",
                     impls={**for_libraries(library), "floor": floor})]
"""
from __future__ import annotations

import gc
import importlib
import itertools
import math
import platform
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

TORCHDICT = "torchdict"
UPSTREAM = "tensordict"
FLOOR = "floor"
LABELS = (TORCHDICT, UPSTREAM, FLOOR)

Run = Callable[[], object]
Prepare = Callable[[Any], Run]


@dataclass
class Case:
    """One job, timed for each implementation in ``impls``.

    Attributes:
        name: the row label in the table.
        impls: ``{label: prepare}`` where ``prepare(data)`` returns the timed callable.
            Labels are usually ``"torchdict"``, ``"tensordict"`` and ``"floor"``.
        setup: builds the shared input once per case (outside timing); its result is
            passed to every ``prepare``. ``None`` passes ``None``.
        target: the goal for torchdict, e.g. ``"<= 2x floor"``,
            ``">= 5x faster than upstream"``, ``"<= 1.2x upstream"``, ``"<= 50 ms"``.
        fresh: for jobs that change their input (setting a *new* key): ``prepare`` is
            called once per timed call, outside timing, so every call sees fresh state.
        self_timed: the callable measures itself and returns the elapsed nanoseconds
            (e.g. a subprocess import); it is called once per sample, not calibrated.
        max_samples: caps the number of samples (for slow, self-timed cases).
        note: a footnote shown under the table.
    """

    name: str
    impls: Mapping[str, Prepare]
    setup: Callable[[], Any] | None = None
    target: str | None = None
    fresh: bool = False
    self_timed: bool = False
    max_samples: int | None = None
    note: str = ""


def for_libraries(make: Callable[[Any, Any], Run]) -> dict[str, Prepare]:
    """Build the torchdict and upstream impls from one function of the library module.

    ``make(lib, data)`` receives the imported module (``torchdict`` or ``tensordict``)
    so the same code exercises both. A library that cannot be imported raises
    ``ImportError`` at prepare time, which drops its column.

    >>> impls = for_libraries(lambda lib, data: (lambda: lib.TensorDict()))
    >>> sorted(impls)
    ['tensordict', 'torchdict']
    """

    def prepare_for(module_name: str) -> Prepare:
        def prepare(data: Any) -> Run:
            return make(importlib.import_module(module_name), data)

        return prepare

    return {TORCHDICT: prepare_for("torchdict"), UPSTREAM: prepare_for("tensordict")}


# --------------------------------------------------------------------------- targets

_TARGET_RE = re.compile(
    r"^\s*(<=|<|>=|>)\s*([0-9]*\.?[0-9]+)\s*"
    r"(x\s*faster\s+than\s+upstream|x\s*floor|x\s*upstream|ns|us|µs|ms|s)\s*$"
)
_UNIT_NS = {"ns": 1.0, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}
_COMPARE = {
    "<=": lambda a, b: a <= b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    ">": lambda a, b: a > b,
}


@dataclass(frozen=True)
class Target:
    """A parsed target: compare ``quantity`` of torchdict against ``bound``.

    ``quantity`` is one of ``"ratio_floor"`` (torchdict / floor), ``"ratio_upstream"``
    (torchdict / upstream), ``"speedup"`` (upstream / torchdict) or ``"time_ns"``.
    """

    text: str
    op: str
    bound: float
    quantity: str

    @classmethod
    def parse(cls, text: str) -> "Target":
        match = _TARGET_RE.match(text)
        if match is None:
            raise ValueError(
                f"cannot parse target {text!r}; expected e.g. '<= 2x floor', "
                "'>= 5x faster than upstream', '<= 1.2x upstream' or '<= 50 ms'"
            )
        op, number, unit = match.group(1), float(match.group(2)), " ".join(match.group(3).split())
        if unit in _UNIT_NS:
            return cls(text, op, number * _UNIT_NS[unit], "time_ns")
        quantity = {
            "x floor": "ratio_floor",
            "xfloor": "ratio_floor",
            "x upstream": "ratio_upstream",
            "xupstream": "ratio_upstream",
        }.get(unit, "speedup")
        return cls(text, op, number, quantity)

    def check(self, result: "CaseResult") -> bool | None:
        """True/False when the needed measurements exist, None otherwise."""
        value = {
            "ratio_floor": result.ratio(TORCHDICT, FLOOR),
            "ratio_upstream": result.ratio(TORCHDICT, UPSTREAM),
            "speedup": result.ratio(UPSTREAM, TORCHDICT),
            "time_ns": result.time(TORCHDICT),
        }[self.quantity]
        return None if value is None else _COMPARE[self.op](value, self.bound)


# --------------------------------------------------------------------------- timing


@dataclass
class Config:
    """How hard to measure. ``quick`` trades precision for a short run."""

    samples: int = 15
    min_sample_ns: int = 2_000_000
    statistic: str = "median"  # or "min": the least disturbed sample, steadier on a busy machine
    max_loops: int = 1_000_000
    max_fresh_loops: int = 2_000  # fresh states held in memory at once

    @classmethod
    def quick(cls) -> "Config":
        return cls(samples=5, min_sample_ns=1_000_000, max_fresh_loops=500)


@dataclass
class Timing:
    """Per-call times (ns) of one implementation, one entry per sample."""

    samples_ns: list[float] = field(default_factory=list)
    loops: int = 0
    error: str | None = None  # "not installed" or "TypeName: message"

    def summary(self, statistic: str = "median") -> float | None:
        """The per-call time in ns by ``statistic`` ("median" or "min"); None on error."""
        if not self.samples_ns or self.error:
            return None
        return min(self.samples_ns) if statistic == "min" else statistics.median(self.samples_ns)


@dataclass
class CaseResult:
    case: Case
    timings: dict[str, Timing]
    target: Target | None
    statistic: str = "median"

    def time(self, label: str) -> float | None:
        """Per-call ns of ``label`` (by the configured statistic), None if not measured."""
        timing = self.timings.get(label)
        return None if timing is None else timing.summary(self.statistic)

    def ratio(self, numerator: str, denominator: str) -> float | None:
        top, bottom = self.time(numerator), self.time(denominator)
        if top is None or bottom is None or bottom <= 0:
            return None
        return top / bottom

    @property
    def target_met(self) -> bool | None:
        return None if self.target is None else self.target.check(self)


def _time_loop(run: Run, loops: int) -> int:
    """Nanoseconds for ``loops`` calls of ``run`` (gc paused, as timeit does)."""
    repeat = itertools.repeat(None, loops)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for _ in repeat:
            run()
        return time.perf_counter_ns() - start
    finally:
        if gc_was_enabled:
            gc.enable()


def _time_fresh(runs: list[Run]) -> int:
    """Nanoseconds for calling each prepared callable once."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for run in runs:
            run()
        return time.perf_counter_ns() - start
    finally:
        if gc_was_enabled:
            gc.enable()


class _Timer:
    """Times one implementation of a case; one instance per label."""

    def __init__(self, case: Case, prepare: Prepare, data: Any, config: Config):
        self.case, self.prepare, self.data, self.config = case, prepare, data, config
        self.run: Run | None = None
        self.loops = 1
        self.batches = 1

    def calibrate(self) -> None:
        """Pick a loop count so one sample lasts about ``config.min_sample_ns``.

        The first calls also warm up caches and lazy imports.
        """
        if self.case.self_timed:
            self.run = self.prepare(self.data)
            return
        if self.case.fresh:
            # Fresh states are built in batches of at most max_fresh_loops (memory);
            # a sample sums enough batches to last min_sample_ns.
            measure = lambda n: _time_fresh(self._fresh_runs(n))  # noqa: E731
            self.loops, per_call = self._calibrate(measure, self.config.max_fresh_loops)
            self.batches = max(1, math.ceil(self.config.min_sample_ns / (per_call * self.loops)))
            return
        self.run = self.prepare(self.data)
        self.run()  # warm-up; also surfaces errors before timing
        self.loops, _ = self._calibrate(lambda n: _time_loop(self.run, n), self.config.max_loops)

    def _calibrate(self, measure: Callable[[int], int], max_loops: int) -> tuple[int, float]:
        """Return (loops per sample, estimated ns per call)."""
        target = self.config.min_sample_ns
        loops = 1
        while True:
            elapsed = measure(loops)
            if elapsed >= target / 10 or loops >= max_loops:
                break
            loops = min(max_loops, loops * 10)
        per_call = max(elapsed / loops, 1.0)
        return max(1, min(max_loops, math.ceil(target / per_call))), per_call

    def _fresh_runs(self, count: int) -> list[Run]:
        return [self.prepare(self.data) for _ in range(count)]

    def sample(self) -> float:
        """One sample: the mean time per call, in ns."""
        if self.case.self_timed:
            return float(self.run())
        if self.case.fresh:
            elapsed = 0
            for _ in range(self.batches):
                elapsed += _time_fresh(self._fresh_runs(self.loops))
            return elapsed / (self.loops * self.batches)
        return _time_loop(self.run, self.loops) / self.loops


def _describe(error: BaseException) -> str:
    if isinstance(error, ImportError):
        return "not installed"
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text[:120]}"


def run_case(case: Case, config: Config) -> CaseResult:
    """Measure every implementation of ``case``, interleaved round-robin.

    Each round takes one sample of every implementation, rotating the order so no
    implementation always runs first; machine noise then hits all of them alike.
    """
    target = Target.parse(case.target) if case.target else None
    timings = {label: Timing() for label in case.impls}
    try:
        data = case.setup() if case.setup is not None else None
    except Exception as error:  # a broken setup fails the whole row, not the run
        for timing in timings.values():
            timing.error = f"setup failed: {_describe(error)}"
        return CaseResult(case, timings, target, config.statistic)

    timers: dict[str, _Timer] = {}
    for label, prepare in case.impls.items():
        timer = _Timer(case, prepare, data, config)
        try:
            timer.calibrate()
        except Exception as error:
            timings[label].error = _describe(error)
            continue
        timers[label] = timer
        timings[label].loops = timer.loops

    samples = config.samples if case.max_samples is None else min(config.samples, case.max_samples)
    order = list(timers)
    for round_index in range(samples):
        shift = round_index % max(1, len(order))
        for label in order[shift:] + order[:shift]:
            if timings[label].error:
                continue
            try:
                timings[label].samples_ns.append(timers[label].sample())
            except Exception as error:
                timings[label].error = _describe(error)
    return CaseResult(case, timings, target, config.statistic)


def run_cases(cases: list[Case], config: Config, progress: Callable[[str], None] | None = None) -> list[CaseResult]:
    for case in cases:  # a malformed target should fail now, not after minutes of timing
        if case.target:
            Target.parse(case.target)
    results = []
    for case in cases:
        if progress is not None:
            progress(case.name)
        results.append(run_case(case, config))
    return results


# --------------------------------------------------------------------------- reports


def format_time(ns: float | None) -> str:
    """Human units: ``format_time(1500) == '1.50 µs'``."""
    if ns is None:
        return "—"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}" if ns / scale >= 100 else f"{ns / scale:.2f} {unit}"
    return f"{ns:.0f} ns"


def _format_ratio(value: float | None, suffix: str = "x") -> str:
    return "—" if value is None else f"{value:.2f}{suffix}"


def _cell(result: CaseResult, label: str) -> str:
    timing = result.timings.get(label)
    if timing is None:
        return "—"
    if timing.error == "not installed":
        return "n/a"
    if timing.error:
        return "error"
    return format_time(result.time(label))


def environment() -> dict[str, str]:
    """Versions and machine facts printed above every table."""
    import os

    facts = {"python": platform.python_version(), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs"}
    for module_name in ("torch", "torchdict", "tensordict"):
        try:
            facts[module_name] = getattr(importlib.import_module(module_name), "__version__", "?")
        except ImportError:
            facts[module_name] = "not installed"
    if facts["torchdict"] != "not installed":
        # torchdict's C helpers (or their pure-Python twins, TORCHDICT_PURE_PYTHON=1) set some rows.
        facts["C helpers"] = "on" if importlib.import_module("torchdict._accel").USING_C else "off"
    return facts


def format_markdown(suite: str, results: list[CaseResult], config: Config, facts: dict[str, str]) -> str:
    """The results of one suite as a markdown section (title, environment, table, notes)."""
    lines = [
        f"## Suite `{suite}`",
        "",
        ", ".join(f"{name} {value}" for name, value in facts.items())
        + f"; {config.samples} samples of >= {config.min_sample_ns / 1e6:g} ms, "
        + f"{'medians' if config.statistic == 'median' else 'minimum'} per call.",
        "",
        "| case | torchdict | tensordict | floor | torchdict / floor | tensordict / floor "
        "| speedup vs tensordict | target | met |",
        "|---|--:|--:|--:|--:|--:|--:|---|:-:|",
    ]
    notes: list[str] = []
    for result in results:
        met = result.target_met
        if result.target is None:
            mark = ""
        else:
            mark = "—" if met is None else ("✅" if met else "❌")
        lines.append(
            "| "
            + " | ".join(
                [
                    result.case.name,
                    _cell(result, TORCHDICT),
                    _cell(result, UPSTREAM),
                    _cell(result, FLOOR),
                    _format_ratio(result.ratio(TORCHDICT, FLOOR)),
                    _format_ratio(result.ratio(UPSTREAM, FLOOR)),
                    _format_ratio(result.ratio(UPSTREAM, TORCHDICT)),
                    result.case.target or "",
                    mark,
                ]
            )
            + " |"
        )
        if result.case.note:
            notes.append(f"- *{result.case.name}*: {result.case.note}")
        for label, timing in result.timings.items():
            if timing.error and timing.error != "not installed":
                notes.append(f"- *{result.case.name}* / {label}: {timing.error}")
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def to_json(suite: str, results: list[CaseResult], config: Config, facts: dict[str, str]) -> dict:
    """Raw numbers for later comparison (median, min, all samples, loop counts)."""
    return {
        "suite": suite,
        "environment": facts,
        "config": {
            "samples": config.samples,
            "min_sample_ns": config.min_sample_ns,
            "statistic": config.statistic,
        },
        "cases": [
            {
                "name": result.case.name,
                "target": result.case.target,
                "target_met": result.target_met,
                "impls": {
                    label: {
                        "median_ns": timing.summary("median"),
                        "min_ns": timing.summary("min"),
                        "samples_ns": timing.samples_ns,
                        "loops": timing.loops,
                        "error": timing.error,
                    }
                    for label, timing in result.timings.items()
                },
            }
            for result in results
        ],
    }


def plot_ratios(suite: str, results: list[CaseResult], path: str) -> bool:
    """A horizontal bar chart of torchdict/floor and tensordict/floor; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in results if r.ratio(TORCHDICT, FLOOR) is not None or r.ratio(UPSTREAM, FLOOR) is not None]
    if not rows:
        return False
    names = [r.case.name for r in rows]
    ours = [r.ratio(TORCHDICT, FLOOR) or 0.0 for r in rows]
    theirs = [r.ratio(UPSTREAM, FLOOR) or 0.0 for r in rows]
    height = 0.38
    figure, axes = plt.subplots(figsize=(9, 0.42 * len(rows) + 1.6))
    positions = range(len(rows))
    axes.barh([p - height / 2 for p in positions], ours, height, label="torchdict / floor", color="#2a7ab9")
    axes.barh([p + height / 2 for p in positions], theirs, height, label="tensordict / floor", color="#c8553d")
    for position, result in zip(positions, rows):
        target = result.target
        if target is not None and target.quantity == "ratio_floor":
            axes.plot([target.bound] * 2, [position - 0.45, position + 0.45], color="black", linewidth=1.5)
    axes.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    axes.set_xscale("log")
    axes.set_yticks(list(positions), names)
    axes.invert_yaxis()
    axes.set_xlabel("time relative to the hand-written dict code (log scale; black tick = target)")
    axes.set_title(f"torchdict benchmarks: suite '{suite}'")
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


# --- plain-dict tree helpers shared by the floors of several suites ---------------------------


def flatten_tree(tree: dict, prefix: str = "", out: dict | None = None) -> dict:
    out = {} if out is None else out
    for key, value in tree.items():
        name = prefix + key
        if isinstance(value, dict):
            flatten_tree(value, name + ".", out)
        else:
            out[name] = value
    return out


def unflatten_tree(flat: dict) -> dict:
    root: dict = {}
    for name, value in flat.items():
        *parents, last = name.split(".")
        node = root
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return root
