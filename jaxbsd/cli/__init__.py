"""The ``jaxbsd`` console command.

Subcommands register themselves on the parser from :func:`build_parser`; to add one::

    parser = build_parser()
    sub = parser.subcommands.add_parser("compress", help="...")
    sub.add_argument(...)
    sub.set_defaults(func=run_compress)   # func(args) -> exit status

``main`` dispatches to ``args.func``. A subcommand validates its arguments before it reads or
writes any file (see :mod:`jaxbsd.cli.args`). User errors are one line on stderr,
``jaxbsd <command>: error: <message>``, with exit status 2 and no traceback: argparse's own
checks, and any ``ValueError`` or ``OSError`` (the library's boundary errors: bad settings,
missing or corrupt files and data) raised by the subcommand. ``--debug`` also prints the
traceback. Any other exception is a bug: it propagates with its traceback (exit status 1).

Every command runs with JAX's persistent compilation cache on (:mod:`jaxbsd.compile_cache`:
``$JAXBSD_CACHE/xla``, or the directory ``JAX_COMPILATION_CACHE_DIR`` names), so a rerun skips
XLA's compile; ``--no-cache`` or ``JAXBSD_COMPILATION_CACHE=0`` turn it off. A cache directory
that cannot be used is a warning, never an error: the command then compiles as without it.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence

from jaxbsd.cli.args import CLIParser, one_line, train_config_from_args
from jaxbsd.cli.compress import add_compress_command
from jaxbsd.cli.hf import add_compress_hf_command
from jaxbsd.cli.train import add_train_command, validate_train_args

__all__ = ["build_parser", "main", "add_train_command", "train_config_from_args", "validate_train_args",
           "SUBCOMMANDS", "USER_ERRORS", "use_compilation_cache"]

#: Functions ``f(subparsers)`` that add one subcommand each; extend to add commands.
SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    add_train_command,     # jaxbsd train (jaxbsd.cli.train; --model lm: jaxbsd.cli.lm)
    add_compress_command,  # jaxbsd compress, the main job (jaxbsd.cli.compress)
    add_compress_hf_command,  # jaxbsd compress-hf, a Hugging Face checkpoint of any family (jaxbsd.cli.hf)
]


#: Exceptions that are the user's to fix: the library raises these at its boundaries with a
#: message naming the argument or file. ``main`` prints them as one ``error:`` line (exit 2).
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError)


def build_parser() -> argparse.ArgumentParser:
    """The ``jaxbsd`` parser; ``parser.subcommands`` is its subparsers action, for extension."""
    parser = CLIParser(
        prog="jaxbsd", description="B-spline decoupling (R-CMTF-BSD) and transformer MLP compression",
    )
    parser.add_argument("--debug", action="store_true", help="on an error, also print the traceback")
    parser.add_argument("--no-cache", action="store_true", help=_NO_CACHE_HELP)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parser.subcommands = subparsers
    for add in SUBCOMMANDS:
        add(subparsers)
    for sub in subparsers.choices.values():  # also after the command: jaxbsd train --debug ...
        try:
            sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="on an error, also print the traceback")
        except argparse.ArgumentError:  # the command defines its own --debug
            pass
        sub.add_argument("--no-cache", action="store_true", default=argparse.SUPPRESS, help=_NO_CACHE_HELP)
    return parser


_NO_CACHE_HELP = ("do not use the persistent compilation cache ($JAXBSD_CACHE/xla; also "
                  "JAXBSD_COMPILATION_CACHE=0): compile every program afresh")


def use_compilation_cache(args: argparse.Namespace):
    """Turn on the persistent compilation cache for a command unless ``--no-cache`` or
    ``JAXBSD_COMPILATION_CACHE=0``; return its directory, or None when off or unusable.

    The directory is ``JAX_COMPILATION_CACHE_DIR``'s where the user set one for JAX, else
    ``$JAXBSD_CACHE/xla``. One that cannot be used (a file, not writable) is a warning on stderr.
    """
    from jaxbsd import compile_cache

    if getattr(args, "no_cache", False) or not compile_cache.enabled_by_environment():
        return None
    import jax

    try:
        return compile_cache.enable_compilation_cache(jax.config.jax_compilation_cache_dir or None)
    except (ValueError, OSError) as err:
        print(f"jaxbsd: warning: compilation cache off: {one_line(err)}", file=sys.stderr, flush=True)
        return None


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the subcommand; returns its status.

    A user error (argparse's checks, or a ``USER_ERRORS`` exception from the subcommand) prints
    ``jaxbsd <command>: error: <message>`` on stderr and raises ``SystemExit(2)``; with
    ``--debug`` the traceback comes first. Other exceptions propagate unchanged.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    command = parser.subcommands.choices[args.command]
    if unknown:  # named after the command they were given to, like every other error
        command.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.command_line = " ".join(["jaxbsd", *argv])
    try:
        use_compilation_cache(args)
        return int(args.func(args) or 0)
    except USER_ERRORS as err:
        if args.debug:
            traceback.print_exc()
        command.error(one_line(err) or type(err).__name__)
    except KeyboardInterrupt:
        if args.debug:
            traceback.print_exc()
        command.exit(130, f"{command.prog}: interrupted\n")
