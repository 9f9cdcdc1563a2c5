"""The markers of a page and the figures in its prose.

A generated block sits between ``<!-- report:NAME -->`` and ``<!-- /report:NAME -->`` (``NAME`` a
table of :data:`reporting.registry.TABLES`). A figure in a sentence is a reference to a committed
result, rendered in place::

    B-spline leads SVD by <!-- fig cmp_vit.vs("bsd", "svd", 0.1).d -->+0.22<!-- /fig -->

The expression between ``<!-- fig`` and ``-->`` is evaluated against :func:`namespace` (one
name per result file, :data:`reporting.registry.SOURCES`, the formatters and the registered
helpers); the text up to ``<!-- /fig -->`` is its rendering, rewritten by ``report.py`` and
compared by ``--check``. A figure quoted from elsewhere (the paper, a run that is not committed)
is wrapped in ``<!-- from SOURCE -->...<!-- /from -->``, SOURCE naming where it comes from. Any
other result-like number (:data:`RESULT_LIKE`) on a page fails ``--check``.
"""

from __future__ import annotations

import pathlib
import re
from typing import Iterable

import numpy as np

from . import committed
from .formats import count, num, pct, pv, ratio, rng, secs, sgn, slash
from .names import prose_name, refined
from .registry import FOLDERS, HELPERS, KINDS, SOURCES, load_tables
from .stats import Paired, pmax

load_tables()  # every table module registers its figure sources and helpers as it is imported

MARKER = re.compile(r"<!-- report:([^ >]*) -->")  # every opening marker, well-formed or not
BLOCK = re.compile(r"(<!-- report:(?P<name>[a-z0-9_-]+) -->\n)(?P<body>.*?)(<!-- /report:(?P=name) -->)", re.S)

FIG = re.compile(r"(?<!`)<!-- fig (?P<expr>[^\n]+?) -->(?P<text>(?:(?!<!--).)*?)<!-- /fig -->", re.S)
FIG_OPEN = re.compile(r"(?<!`)<!-- fig\b")  # a marker quoted in code (`<!-- fig ...`) is text
FROM = re.compile(r"(?<!`)<!-- from (?P<source>[^>\n]*?\S[^>\n]*?) -->(?P<text>(?:(?!<!--).)*?)<!-- /from -->", re.S)
FROM_OPEN = re.compile(r"(?<!`)<!-- from\b")

#: What counts as a result-like number in prose: a percentage, a p-value, a ratio ("5.8×",
#: not a shape like 8×8), a signed difference (+0.99, −0.20), a difference or time in points,
#: bits per character or seconds with decimals.
RESULT_LIKE = re.compile(
    r"(?<![\w.])\d+(?:[.,]\d+)?(?:[–-]\d+(?:[.,]\d+)?)?\s?%"          # 88.55 %, 87–89 %
    r"|\bp\s?(?:[=>≤≥]|<(?!\s?0\.05\b))\s?\d*\.\d+"                  # p = 0.022 (p < 0.05 is the test's level)
    r"|(?<![\w.×])\d+(?:\.\d+)?(?:[–-]\d+(?:\.\d+)?)?\s?×(?!\s?\d)"    # 5.8×, 5.8–6.5×, not 8×8
    r"|(?<![\w.)\]])[+−±]\s?\d+\.\d+"                                  # +0.99, −0.20
    r"|(?<![\w.])\d+\.\d+(?:[–-]\d+\.\d+)?\s(?:points?|bpc|bits|s|ms|µs|min|h)\b")  # 0.45 s, 0.7 points


def namespace(results: pathlib.Path | None = None, benchmarks: pathlib.Path | None = None) -> dict:
    """What a figure's expression sees: each of :data:`SOURCES` (loaded on first use) and the
    formatters."""
    results = results or committed.RESULTS
    benchmarks = benchmarks or committed.BENCHMARKS

    def path_of(name: str) -> pathlib.Path:
        return (benchmarks if FOLDERS[name] == "benchmarks" else results) / SOURCES[name]

    class Lazy(dict):
        def __missing__(self, name):
            if name not in SOURCES:
                raise KeyError(name)
            self[name] = value = KINDS[name](committed.read_json(path_of(name)))
            value.source = name
            return value

    def has(name: str, *methods: str, rho: float | None = None) -> bool:
        """Whether the result ``name`` is committed and, for a study, has runs of each of ``methods``
        (at ρ, or at any ρ): the guard of a sentence that only a result yet to land can write,
        ``<!-- fig (...) if has("rf_deit", "prune-ref300") else "..." -->``."""
        if not path_of(name).exists():
            return False
        return not methods or ns[name].has(*methods, rho=rho)

    def present(*names: str, methods: Iterable[str] = ()) -> list:
        """The studies among ``names`` that are committed and have runs of each of ``methods``."""
        return [ns[n] for n in names if has(n, *methods)]

    ns = Lazy(num=num, pct=pct, slash=slash, pmax=pmax, sgn=sgn, pv=pv, rng=rng, ratio=ratio, count=count, secs=secs, Paired=Paired,
              np=np, min=min, max=max, abs=abs, len=len, sum=sum, round=round, sorted=sorted, zip=zip,
              str=str, int=int, float=float, next=next, list=list, all=all, any=any,
              has=has, present=present, prose_name=prose_name, refined=refined, **HELPERS)
    return ns


def figure(expr: str, ns: dict | None = None) -> str:
    """The rendering of one figure's expression."""
    ns = namespace() if ns is None else ns
    if "][" in expr or "](" in expr:
        raise ValueError(f"figure `{expr}`: write r[\"a\", \"b\"], not r[\"a\"][\"b\"] (Markdown reads ][ and ]( as links)")
    try:
        for name in set(re.findall(r"[A-Za-z_]\w*", expr)) & set(SOURCES):
            try:
                ns[name]  # load the results it names (comprehensions see globals only)
            except FileNotFoundError:
                pass  # absent: an expression that reads it fails naming it; one guarded by has() does not
        value = eval(expr, {**ns, "__builtins__": {}})  # noqa: S307  (our own pages' expressions)
    except NameError as e:
        if e.name in SOURCES:
            raise ValueError(f"figure `{expr}` reads {e.name} ({SOURCES[e.name]}), which is not committed: guard it "
                             f"with has(\"{e.name}\", ...)") from e
        raise ValueError(f"figure `{expr}` cannot be evaluated: {type(e).__name__}: {e}") from e
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"figure `{expr}` cannot be evaluated: {type(e).__name__}: {e}") from e
    return value if isinstance(value, str) else str(value)


def figures(text: str) -> list[str]:
    """The expressions of the figures in ``text``."""
    return [m.group("expr") for m in FIG.finditer(text)]


def unmarked_figures(text: str) -> list[tuple[int, str]]:
    """``(line, number)`` for each result-like number of ``text`` that is neither generated (a
    report block, a figure) nor marked as quoted from elsewhere. Code (fenced or inline), link
    targets and HTML comments are not prose and are skipped."""
    keep_lines = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731
    text = BLOCK.sub(keep_lines, text)
    text = FIG.sub("⟨fig⟩", text)
    text = FROM.sub("⟨quoted⟩", text)
    text = re.sub(r"^(```|~~~).*?^\1", keep_lines, text, flags=re.S | re.M)
    text = re.sub(r"<!--.*?-->", keep_lines, text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "⟨code⟩", text)
    text = re.sub(r"\]\([^)\s]*\)", "]", text)
    return [(i, m.group(0)) for i, line in enumerate(text.splitlines(), 1) for m in RESULT_LIKE.finditer(line)]


def misplaced_markers(text: str) -> list[int]:
    """Lines that begin with a figure or quote marker: Markdown reads a line that starts with
    ``<!--`` as an HTML block, which ends the paragraph or list item around it on the site."""
    return [i for i, line in enumerate(text.splitlines(), 1) if re.match(r"\s*<!-- /?(fig|from)\b", line)]
