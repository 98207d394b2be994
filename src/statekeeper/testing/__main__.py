"""``python -m statekeeper.testing``: validate a store backend and print the report.

Exits 0 when every base test passed and nothing failed, 1 otherwise, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from statekeeper.testing.registry import BACKENDS, BASE, CAPABILITIES, EXTENDED, SCHEMES
from statekeeper.testing.validate import validate


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m statekeeper.testing",
        description="Run statekeeper's store conformance suite against one backend.",
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--store", metavar="URL", help="a store URL, e.g. sqlite:///state.db")
    target.add_argument("--backend", metavar="NAME", help="a registered conformance backend")
    target.add_argument("--list", action="store_true", help="list backends and capabilities")
    parser.add_argument(
        "--import",
        dest="imports",
        metavar="MODULE",
        action="append",
        default=[],
        help="import a module first (one registering a backend or scheme); repeatable",
    )
    parser.add_argument(
        "--capability",
        dest="capabilities",
        metavar="NAME",
        action="append",
        choices=sorted(EXTENDED),
        help="declare an extended capability (replaces the declared ones); repeatable",
    )
    parser.add_argument("-k", dest="keyword", metavar="EXPR", help="only tests matching EXPR")
    parser.add_argument(
        "--show-output", action="store_true", help="show pytest's own output as it runs"
    )
    return parser


def _listing() -> str:
    lines = ["capabilities:"]
    lines += [f"  {name:<10} {about}" for name, about in CAPABILITIES.items()]
    lines.append("backends:")
    for made in BACKENDS.values():
        lines.append(f"  {made.name:<15} {', '.join([BASE, *sorted(made.capabilities)])}")
    lines.append(f"URL schemes: {', '.join(sorted(SCHEMES))}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.list:
        for module in args.imports:
            importlib.import_module(module)
        print(_listing())
        return 0
    try:
        report = validate(
            args.store or args.backend,
            capabilities=args.capabilities,
            imports=args.imports,
            keyword=args.keyword,
            show_output=args.show_output,
        )
    except (ValueError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.render())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
