"""Command line of the benchmarks: one sub-command per module of ``paged.bench``."""

import argparse
import importlib
import pkgutil
import sys

import paged.bench


def _experiments() -> dict:
    found = {}
    for info in pkgutil.iter_modules(paged.bench.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"paged.bench.{info.name}")
        if hasattr(module, "add_arguments") and hasattr(module, "run"):
            found[info.name] = module
    return found


def main(argv=None) -> int:
    experiments = _experiments()
    parser = argparse.ArgumentParser(prog="python -m paged.bench", description=paged.bench.__doc__)
    sub = parser.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    for name, module in sorted(experiments.items()):
        doc = (module.__doc__ or name).strip().splitlines()[0]
        p = sub.add_parser(name, help=doc, description=module.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
    args = parser.parse_args(argv)
    return experiments[args.experiment].run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
