"""PlexRL's top-level entry points: the ``plexrl`` command and the ``platform/`` path helper."""

import argparse
import sys
from pathlib import Path

PLATFORM_DIR = Path(__file__).resolve().parent / "platform"


def add_platform_to_path() -> Path:
    """Put ``platform/`` (the Django source root) first on ``sys.path``; idempotent.

    Called by ``manage.py``, ``config.asgi`` and ``config.wsgi`` before Django starts, so the apps
    import as ``accounts``, ``jobs``, ``billing`` and ``config``. ``platform/`` has no
    ``__init__.py``: it must never become importable as ``platform``, which is a stdlib module.
    """
    # The absolute path, even when a relative entry (the working directory) already reaches it.
    if str(PLATFORM_DIR) not in sys.path:
        sys.path.insert(0, str(PLATFORM_DIR))
    return PLATFORM_DIR


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line and exit status 2 (scripts read the line, people the hint)."""

    def error(self, message: str):
        # A subcommand's parser is "plexrl train": its errors still start "plexrl: error:".
        self.exit(2, f"{self.prog.split()[0]}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from engine.cli import add_engine_commands
    from engine.platform_cli import add_platform_commands

    parser = _Parser(prog="plexrl", description="PlexRL: multiplexed RLVR training.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add_engine_commands(sub)
    add_platform_commands(sub)
    demo = sub.add_parser("demo", help="run the demo (for now: one training run with defaults)")
    demo.set_defaults(func=_demo)
    return parser


def _demo(args: argparse.Namespace) -> int:
    from engine.cli import cmd_train

    train = build_parser().parse_args(["train"])
    return cmd_train(train)


def main(argv: list[str] | None = None) -> int:
    from engine.cli import run

    args = build_parser().parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
