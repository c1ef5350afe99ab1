"""`reservoir`: the one command-line entry point."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from shared.config import ConfigError, load_config


def _check_config(args: argparse.Namespace) -> int:
    text = Path(args.file).read_text() if args.file != "-" else sys.stdin.read()
    try:
        config = load_config(text)
    except ConfigError as err:
        print(f"{args.file}: invalid: {err}", file=sys.stderr)
        return 1
    print(f"{args.file}: valid ({len(config.windows)} windows, dryRun={str(config.dry_run).lower()})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reservoir", description="Reserve Kubernetes capacity for batch workloads.")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check-config", help="validate a config.yaml with the same model the agent uses")
    check.add_argument("file", help="path to config.yaml, or - for standard input")
    check.set_defaults(run=_check_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
