"""Argument types and checks shared by the ``jaxbsd`` subcommands.

A subcommand validates everything it was given before it reads or writes a file: value ranges
through the argparse types here (a bad value is argparse's one-line ``error:``), then the paths
with :func:`existing_path`, :func:`output_file`, :func:`output_dir` and
:func:`checkpoint_slot`. These raise ``ValueError`` naming the flag; :func:`jaxbsd.cli.main`
turns ``ValueError`` and ``OSError`` into ``jaxbsd <command>: error: <message>`` and exit
status 2.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import re

__all__ = [
    "CLIParser",
    "DefaultsHelpFormatter",
    "show_progress",
    "open_fraction",
    "one_line",
    "positive_int",
    "nonnegative_int",
    "positive_float",
    "nonnegative_float",
    "fraction",
    "existing_path",
    "output_file",
    "output_dir",
    "checkpoint_slot",
    "add_train_config_flags",
    "train_config_from_args",
]

# numpy's np.load advice for a file holding pickled data ("... If you trust the file you can load
# it unsafely using the `allow_pickle=` keyword argument or `pickle.load()`.", or the older
# "Cannot load file containing pickled data when allow_pickle=False"): wrong advice for a
# corrupt checkpoint or data file, whatever library message quotes it.
_UNSAFE_ADVICE = re.compile(r"[^.:;(]*allow_pickle.*?(?:`pickle\.load\(\)`\.|\.(?=\s|$)|$)")


def one_line(message: object) -> str:
    """``message`` as one line: its lines joined by ``"; "``, without numpy's advice to load a
    file unsafely (``allow_pickle``)."""
    text = "; ".join(line.strip() for line in str(message).splitlines() if line.strip())
    return _UNSAFE_ADVICE.sub("", text).rstrip(" :;")


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """``--help`` shows every option's default, ``(default: X)``, where it has one (not for flags,
    nor for options whose default is None: their help says what they mean then)."""

    def _get_help_string(self, action):
        help = action.help or ""
        default = action.default
        if ("%(default)" in help or default is None or default is False or default is argparse.SUPPRESS
                or not action.option_strings or isinstance(action, argparse._StoreConstAction)):
            return help
        return f"{help} (default: %(default)s)".lstrip()


class CLIParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``<prog>: error: <message>``, with exit
    status 2 (``--help`` shows the usage and every default). Its subcommand parsers are of this class too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


def _number(text: str, kind: type, what: str, ok) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    return _number(text, int, "a positive integer", lambda v: v >= 1)


def nonnegative_int(text: str) -> int:
    """argparse type: an int >= 0."""
    return _number(text, int, "an integer >= 0", lambda v: v >= 0)


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    return _number(text, float, "a finite number > 0", lambda v: math.isfinite(v) and v > 0)


def nonnegative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    return _number(text, float, "a finite number >= 0", lambda v: math.isfinite(v) and v >= 0)


def fraction(text: str) -> float:
    """argparse type: a number in [0, 1)."""
    return _number(text, float, "a number in [0, 1)", lambda v: 0 <= v < 1)


def open_fraction(text: str) -> float:
    """argparse type: a number in (0, 1) (a share to remove: 0 would remove nothing)."""
    return _number(text, float, "a number in (0, 1) (0 removes nothing)", lambda v: 0 < v < 1)


def existing_path(flag: str, value: str | None) -> pathlib.Path | None:
    """``value`` as a path that exists (None stays None).

    Raises:
        ValueError: nothing at ``value``, naming ``flag``.
    """
    if value is None:
        return None
    path = pathlib.Path(value)
    if not path.exists():
        raise ValueError(f"{flag} {value}: no such file or directory")
    return path


def output_file(flag: str, value: str | None) -> pathlib.Path | None:
    """``value`` as a file that can be written: not a directory, in a directory that exists.

    Raises:
        ValueError: naming ``flag``.
    """
    if value is None:
        return None
    path = pathlib.Path(value)
    if path.is_dir():
        raise ValueError(f"{flag} {value}: is a directory, expected a file name")
    if not path.parent.is_dir():
        raise ValueError(f"{flag} {value}: no such directory {path.parent}")
    return path


def output_dir(flag: str, value: str) -> pathlib.Path:
    """``value`` as a directory to write into: absent (it will be created) or a directory.

    Raises:
        ValueError: ``value`` exists and is not a directory, naming ``flag``.
    """
    path = pathlib.Path(value)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {value}: exists and is not a directory")
    return path


def checkpoint_slot(flag: str, path: str | pathlib.Path | None) -> None:
    """Check that a checkpoint may be saved at ``path``: nothing there, an empty directory, or
    a readable jaxbsd checkpoint (which the save replaces). Reads only its header.

    Raises:
        ValueError: something else is there, naming ``flag`` and ``path``.
    """
    if path is None:
        return
    path = pathlib.Path(path)
    if not path.exists() or (path.is_dir() and not any(path.iterdir())):
        return
    from jaxbsd.checkpoint import read_checkpoint_header

    try:
        read_checkpoint_header(path)
    except (ValueError, OSError) as err:
        raise ValueError(f"{flag}: {path} exists and is not a readable jaxbsd checkpoint, refusing to "
                         f"overwrite it ({one_line(err)})") from err


_FLAG_TYPES = {"int": int, "float": float, "str": str, "float | None": float, "int | None": int}


def add_train_config_flags(p: argparse.ArgumentParser) -> None:
    """One ``--flag`` per :class:`jaxbsd.training.TrainConfig` field, with no argparse default:
    a flag left out keeps the (model, data set) recipe's value, and TrainConfig validates."""
    import dataclasses

    from jaxbsd.training import TrainConfig

    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        extra = {"choices": f.metadata["choices"]} if "choices" in f.metadata else {}
        p.add_argument(
            f"--{f.name.replace('_', '-')}", dest=f.name, type=_FLAG_TYPES[kind], default=argparse.SUPPRESS,
            help=f"{f.metadata['help']} (default: the recipe's, else {getattr(defaults, f.name)})", **extra,
        )


def train_config_from_args(args: argparse.Namespace):
    """The :class:`~jaxbsd.training.TrainConfig` of parsed ``jaxbsd train`` arguments: the recipe
    for ``args.model`` on ``args.dataset`` (``TrainConfig.recipe``), with the flags given.

    Raises:
        ValueError: a flag value TrainConfig rejects (the message names it).
    """
    import dataclasses

    from jaxbsd.training import TrainConfig

    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(args, f.name)}
    return TrainConfig.recipe(args.model, args.dataset).replace(**given)


def show_progress(args: argparse.Namespace) -> bool:
    """Progress bars unless ``--no-progress``, and only on a terminal: redrawn bars garble a log file."""
    import sys

    return not args.no_progress and sys.stderr.isatty()
