"""``python -m engine bench SCENARIO``: run benchmark scenarios and print their figures
(:mod:`engine.bench.runner`)."""

from __future__ import annotations

import argparse
import sys

from engine.bench.runner import SCENARIOS, run_benchmarks
from engine.cli.exits import EXIT_OK, EXIT_USAGE
from engine.config import EngineConfig

__all__ = ["run_bench"]


def run_bench(args: argparse.Namespace, config: EngineConfig) -> int:
    """Run ``bench``: a scenario by name, or ``all``; an unknown name is a usage error."""
    if args.scenario != "all" and args.scenario not in SCENARIOS:
        known = ", ".join([*SCENARIOS, "all"])
        print(
            f"engine: error: unknown scenario {args.scenario!r}; choose one of {known}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    run_benchmarks(
        config,
        [args.scenario],
        json_path=args.json_file,
        markdown_path=args.markdown,
        quick=args.quick,
        tasks=args.tasks,
        minutes=args.minutes,
    )
    return EXIT_OK
