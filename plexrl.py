"""The ``plexrl`` command: the engine's and the platform's subcommands, and ``up`` / ``demo``."""

import argparse
import sys

from platform_path import add_platform_to_path


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line and exit status 2 (scripts read the line, people the hint)."""

    def error(self, message: str):
        # A subcommand's parser is "plexrl train": its errors still start "plexrl: error:".
        self.exit(2, f"{self.prog.split()[0]}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from engine.cli.engine_commands import add_engine_commands
    from engine.cli.platform_commands import add_platform_commands

    parser = _Parser(prog="plexrl", description="PlexRL: multiplexed RLVR training.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add_engine_commands(sub)
    add_platform_commands(sub)
    up = sub.add_parser("up", help="run the whole platform in one process tree: web server and dashboard, "
                                   "Celery worker and beat, the engine on a local Ray (Ctrl-C stops it)")
    _serving(up)
    up.set_defaults(func=_up)
    demo = sub.add_parser("demo", help="plexrl up, plus a demo organization and admin and four demo jobs "
                                       "of different shapes, with their progress in the terminal")
    _serving(demo)
    demo.add_argument("--exit-after-jobs", action="store_true",
                      help="stop once the demo jobs have ended: exit 0 if they all succeeded, 1 if not")
    demo.add_argument("--steps", type=_steps, default=None,
                      help="run each demo job for at most this many steps, a quicker look (default: 30-40 "
                           "a job; applies to jobs the first run submits)")
    demo.set_defaults(func=_up)
    return parser


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-65535)")
    return int(text)


def _steps(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of steps")
    return int(text)


def _serving(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="interface to serve on (default: %(default)s)")
    parser.add_argument("--port", type=_port, default=8000, help="port to serve on (default: %(default)s)")
    parser.add_argument("--no-browser", action="store_true", help="do not open the dashboard in a browser")


def _up(args: argparse.Namespace) -> int:
    add_platform_to_path()
    from config import embedded

    if not embedded.port_free(args.host, args.port):
        print(f"plexrl: error: {args.host}:{args.port} is in use (choose another with --port)", file=sys.stderr)
        return 2
    embedded.install_signal_handlers()
    if args.command == "demo":
        code = embedded.demo(host=args.host, port=args.port, open_browser=not args.no_browser,
                             exit_after_jobs=args.exit_after_jobs, steps=args.steps)
    else:
        code = embedded.up(host=args.host, port=args.port, open_browser=not args.no_browser)
    embedded.exit_within(code)
    return code


def main(argv: list[str] | None = None) -> int:
    from engine.cli.engine_commands import run

    args = build_parser().parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
