"""The result tables of the README and the documentation site, generated from the committed
result JSON, and the staleness guard.

Usage::

    python experiments/report.py            # rewrite the generated blocks and figures of README.md and docs/
    python experiments/report.py --check    # exit 1 if a result is stale, a block or figure is out of date,
                                            # or a result-like number is typed by hand
    python experiments/report.py --results DIR   # read the results from DIR (a regenerated copy)

Every generated block sits between ``<!-- report:NAME -->`` and ``<!-- /report:NAME -->``;
nothing between the markers is typed by hand. ``NAME`` is a key of :data:`TABLES`. The pages
rendered and checked are :func:`target_files`: ``README.md`` (the short ``headline-*`` tables)
and every page of the documentation site under ``docs/``.

A figure in a sentence is a reference too: ``<!-- fig EXPR -->TEXT<!-- /fig -->``, where
``EXPR`` is a Python expression over the committed results (one short name per file,
:data:`SOURCES`, with helpers such as ``cmp_vit.vs("bsd", "svd", 0.1).d`` for a difference
paired over seeds, recomputed from the per-seed runs) and the formatters :func:`pct`,
:func:`sgn`, :func:`pv`, :func:`rng`, :func:`ratio`, :func:`count`...; ``TEXT`` is its
rendering, rewritten by this script. A sentence that only a result yet to be committed can
write is one figure guarded by ``has``: ``<!-- fig ("... " + rf_deit.moves("prune", 0.5)) if
has("rf_deit", "prune-ref300") else "not committed yet" -->`` renders the fallback until the
result (and those runs) exist, then the sentence; an unguarded figure of an absent result fails. The HTML comments are invisible on the site. A number
quoted from elsewhere (the paper, a run that is not committed) is wrapped in
``<!-- from SOURCE -->...<!-- /from -->``, naming the source. ``--check`` fails, naming file and
line, when a block or a figure no longer matches its result, and when a result-like number
(:data:`RESULT_LIKE`: a percentage, a p-value, a ``×`` ratio, a signed difference, a time or
difference with decimals) appears anywhere else in the prose of a page.

Staleness: every JSON under ``experiments/results/`` and ``benchmarks/`` records a
``provenance`` (:func:`jaxbsd.io.provenance`: command, commit, source hashes). A result computed
with the solver also records ``solver_fingerprint``, the values of a few canonical float64
solves (:mod:`jaxbsd.solver.fingerprint`). ``--check`` (run by the test suite and by ``.ci/run``)
recomputes the fingerprint once and fails for a result whose recorded fingerprint moved beyond
:data:`jaxbsd.solver.fingerprint.RTOL`, naming the result, the entries that moved and the command
that regenerates it; a solver result without a fingerprint, and a result without provenance,
fail too. A change that leaves the solver's numbers alone (a comment, a refactoring) stales
nothing; ``commit``, ``source_hash`` and ``solver_hash`` are kept as information only.
"""

from __future__ import annotations

import sys
import types

from reporting import committed, figures, formats, names, pages, registry, stale, stats

# This script is the package's entry point and its one import for tests and scripts
# (``import report`` with experiments/ on sys.path, as pytest's pythonpath puts it). The package, by job:
#   committed   where the results are, loading one, the provenance line of a table
#   stale       the staleness guard (the only module that imports jaxbsd, lazily)
#   formats     table cells and the formatters of figures in prose
#   names       methods by name, and the -ref… suffix of refined units
#   stats       Paired, Result, Study, AutoRule: statistics recomputed from the per-seed runs
#   registry    TABLES, SOURCES, helpers: what each module of reporting/tables registers
#   figures     the markers of a page, the prose-figure engine, RESULT_LIKE
#   pages       render, --check and the command line
#   tables/     one module per family of tables (how to add a study: reporting/__init__.py)
MODULES = (committed, registry, formats, names, stats, stale, figures, pages, *registry.load_tables())

#: Where each name of this module lives: setting ``report.NAME`` sets it there, so a test that
#: points ``report.RESULTS`` (or ``report.target_files``) elsewhere redirects what the package reads.
_HOME: dict[str, tuple[types.ModuleType, str]] = {"_load": (committed, "load"),
                                                  "_source_line": (committed, "source_line")}
for _module in MODULES:
    for _name, _value in vars(_module).items():
        defined_here = getattr(_value, "__module__", None) == _module.__name__
        if not _name.startswith("_") and _name not in _HOME and (defined_here or _name.isupper()):
            _HOME[_name] = (_module, _name)
globals().update({name: getattr(module, attr) for name, (module, attr) in _HOME.items()})


class _Redirecting(types.ModuleType):
    def __setattr__(self, name, value):
        if name in _HOME:
            module, attr = _HOME[name]
            setattr(module, attr, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Redirecting

if __name__ == "__main__":
    sys.exit(pages.main())
