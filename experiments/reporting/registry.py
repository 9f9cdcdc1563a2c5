"""What the pages can name: the generated tables (``<!-- report:NAME -->``), the result files a
figure reads by short name (``<!-- fig NAME.… -->``) and the helpers a figure may call.

Each module of :mod:`reporting.tables` registers its own next to its code, when it is imported::

    @table("comparison")                    # the block <!-- report:comparison -->
    def comparison_table() -> str: ...

    @table("vit-cifar10", "vit")            # one function, several blocks: its arguments
    @table("swin-cifar10", "swin")
    def cifar10_table(model: str) -> str: ...

    source("cmp_vit", "comparison_vit_fashion-mnist.json", Study)   # cmp_vit in a figure: a Study

    @helper                                 # callable by name in a figure
    def auto_rules(*studies) -> str: ...

:func:`load_tables` imports every module of :mod:`reporting.tables` (a new one is found without
editing any list). Names are unique: a second registration of one is an error.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Callable

#: Generated blocks by name: a function of no argument returning the block's Markdown.
TABLES: dict[str, Callable[[], str]] = {}
#: Result files by the short name a figure uses, the class that wraps each, and its folder.
SOURCES: dict[str, str] = {}
KINDS: dict[str, type] = {}
FOLDERS: dict[str, str] = {}
#: Functions a figure may call by name, beside the formatters.
HELPERS: dict[str, Callable] = {}


def _claim(registry: dict, name: str, what: str) -> None:
    if name in registry:
        raise ValueError(f"{what} {name!r} is registered twice")


def table(name: str, *args):
    """Register the decorated function as the generator of the block ``<!-- report:name -->``,
    called with ``args``; the function is returned unchanged."""
    def register(fn: Callable[..., str]) -> Callable[..., str]:
        _claim(TABLES, name, "table")
        TABLES[name] = functools.partial(fn, *args) if args else fn
        return fn
    return register


def source(name: str, file: str, kind: type, folder: str = "results") -> None:
    """A figure's ``name`` reads ``file`` (in ``experiments/results/``, or ``benchmarks/`` with
    ``folder="benchmarks"``), wrapped in ``kind`` (a :class:`reporting.stats.Result`)."""
    if folder not in ("results", "benchmarks"):
        raise ValueError(f"folder must be 'results' or 'benchmarks', got {folder!r}")
    _claim(SOURCES, name, "figure source")
    SOURCES[name], KINDS[name], FOLDERS[name] = file, kind, folder


def helper(fn: Callable) -> Callable:
    """Make ``fn`` callable by its name in a figure's expression."""
    _claim(HELPERS, fn.__name__, "figure helper")
    HELPERS[fn.__name__] = fn
    return fn


def load_tables() -> list:
    """Import every module of :mod:`reporting.tables` (once: they register as they are imported)."""
    package = importlib.import_module(".tables", __package__)
    return [importlib.import_module(f"{package.__name__}.{m.name}")
            for m in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name)]
