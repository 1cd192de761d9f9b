"""Run the benchmark suites and write their tables.

    python benchmarks/run.py                      # every suite, full precision
    python benchmarks/run.py --quick              # every suite, a short run
    python benchmarks/run.py --suite core --filter "set"
    python benchmarks/run.py --list

For each suite ``benchmarks/bench_<name>.py`` it prints a markdown table and
writes ``<out>/<name>.md``, ``<out>/<name>.json`` and, when matplotlib is
installed, ``<out>/<name>.png``. See benchmarks/README.md.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
SRC_DIR = os.path.join(REPO_ROOT, "src")

# Suites import the harness as `_harness`; torchdict is taken from this checkout.
sys.path.insert(0, BENCH_DIR)
if os.path.isdir(SRC_DIR):
    sys.path.insert(0, SRC_DIR)

import _harness  # noqa: E402


def available_suites() -> list[str]:
    names = []
    for file_name in sorted(os.listdir(BENCH_DIR)):
        match = re.fullmatch(r"bench_(\w+)\.py", file_name)
        if match:
            names.append(match.group(1))
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="all", help="comma-separated suite names (default: all)")
    parser.add_argument("--quick", action="store_true", help="fewer, shorter samples (a couple of minutes)")
    parser.add_argument("--out", default=os.path.join(BENCH_DIR, "results"), help="folder for .md/.json/.png")
    parser.add_argument("--filter", default=None, help="only cases whose name matches this regex")
    parser.add_argument("--samples", type=int, default=None, help="samples per implementation")
    parser.add_argument("--min-sample-ms", type=float, default=None, help="minimum duration of one sample")
    parser.add_argument(
        "--stat",
        choices=("median", "min"),
        default="median",
        help="per-implementation statistic (min is steadier on a busy machine)",
    )
    parser.add_argument("--list", action="store_true", help="list suites and cases, run nothing")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG chart")
    return parser.parse_args(argv)


def load_suite(name: str):
    module = importlib.import_module(f"bench_{name}")
    if not hasattr(module, "cases"):
        raise SystemExit(f"benchmarks/bench_{name}.py has no cases() function")
    return module


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    known = available_suites()
    chosen = known if args.suite == "all" else [name.strip() for name in args.suite.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in known]
    if unknown:
        raise SystemExit(f"unknown suite(s) {unknown}; available: {known}")

    config = _harness.Config.quick() if args.quick else _harness.Config()
    if args.samples is not None:
        config.samples = args.samples
    if args.min_sample_ms is not None:
        config.min_sample_ns = int(args.min_sample_ms * 1e6)
    config.statistic = args.stat
    pattern = re.compile(args.filter) if args.filter else None

    if not args.list:
        os.makedirs(args.out, exist_ok=True)
    facts = _harness.environment()
    for suite in chosen:
        cases = load_suite(suite).cases()
        if pattern is not None:
            cases = [case for case in cases if pattern.search(case.name)]
        if args.list:
            print(f"{suite}:")
            for case in cases:
                print(f"  {case.name}" + (f"   [target {case.target}]" if case.target else ""))
            continue
        started = time.perf_counter()

        def progress(name: str, suite: str = suite) -> None:
            print(f"[{suite}] {name} ...", file=sys.stderr, flush=True)

        results = _harness.run_cases(cases, config, progress)
        table = _harness.format_markdown(suite, results, config, facts)
        print(table)
        with open(os.path.join(args.out, f"{suite}.md"), "w", encoding="utf-8") as handle:
            handle.write(table)
        with open(os.path.join(args.out, f"{suite}.json"), "w", encoding="utf-8") as handle:
            json.dump(_harness.to_json(suite, results, config, facts), handle, indent=1)
        if not args.no_plot:
            chart = os.path.join(args.out, f"{suite}.png")
            if _harness.plot_ratios(suite, results, chart):
                print(f"chart: {chart}", file=sys.stderr)
        print(f"[{suite}] done in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
