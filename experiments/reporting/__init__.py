"""The results layer: the tables and figures of the README and the documentation site, generated
from the committed results, and the staleness guard. Its command line is
``python experiments/report.py [--check] [--results DIR]``; ``import report`` (with
``experiments/`` on ``sys.path``: pyproject's pytest ``pythonpath``) is its one import for tests and scripts. No module imports JAX
but :mod:`.stale` (lazily, for the solver's fingerprint); ``lint-imports`` checks it.

Adding a study
==============

1. **The result file.** The study's script writes ``experiments/results/<name>.json`` (through
   ``jaxbsd.io``'s atomic JSON writer) with a ``provenance``, :func:`jaxbsd.io.provenance`
   (``command``, ``commit``, ``source_hash``; computed with the solver, also
   ``solver_fingerprint`` and ``fingerprint_version``; ``solver=False`` for one that is not).
   ``--check`` reads every ``experiments/results/*.json`` and ``benchmarks/*.json``: no
   provenance, or a solver result whose fingerprint is missing or has moved, is a problem naming
   the file and its command. A study read through :class:`.stats.Study` also records ``runs``
   (one per method, ``reduction`` ρ and ``seed``: ``status`` "ok" and the measured value,
   ``accuracy`` by default), ``rows`` (the summary per method and ρ) and ``plan``
   (``budgets``, ``seeds``, ``methods``).

2. **One module, ``reporting/tables/<family>.py``**, that registers its tables and figure sources
   next to their code (:mod:`.registry`); nothing else is edited, the module is found by
   :func:`.registry.load_tables`::

       from .. import committed
       from ..committed import source_line
       from ..formats import md, pm
       from ..registry import source, table
       from ..stats import Study

       @table("distill")                     # the page's <!-- report:distill --> block
       def distill_table() -> str:
           d = committed.load("distill_vit_fashion-mnist.json")
           if d is None:                     # never fail: say what would write it
               return "No current result committed (`python experiments/distill.py`)."
           s = Study(d)
           rows = [[m, f"{rho:g}", s.pm(m, rho)] for rho in s.budgets() for m in d["plan"]["methods"]]
           return "\\n".join([source_line(d), "", md(["method", "ρ", "top-1 %"], rows)])

       source("dst_vit", "distill_vit_fashion-mnist.json", Study)   # dst_vit in a figure

   Read results through ``committed.load`` and ``committed.RESULTS`` (never a copy of the path):
   ``--results DIR`` and the tests redirect them. A helper a figure calls by name is decorated
   ``@helper``. A module stays under 400 lines: a family that grows is split in two.

3. **The pages.** Put the block on a page (``docs/results.md``; the README only holds
   ``headline-*`` tables)::

       <!-- report:distill -->
       <!-- /report:distill -->

   and figures in the prose, ``<!-- fig dst_vit.vs("distill", "prune", 0.5).d -->?<!-- /fig -->``
   (a sentence waiting for a result not committed yet: ``(...) if has("dst_vit") else "..."``).
   Then ``python experiments/report.py`` writes them.

4. **How ``--check`` sees it.** ``python experiments/report.py --check`` (CI, and the test suite)
   fails on a stale result, on a block or figure that no longer matches its result, and on a
   result-like number typed by hand; ``tests/test_results_fresh.py`` fails on a registered table
   that no page shows and a block that no module registers, and renders every table.
"""
