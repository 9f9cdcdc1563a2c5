"""One-off: add the solver fingerprint to committed results whose solver sources are the current ones.

Usage::

    python experiments/backfill_fingerprint.py            # edit the results in place
    python experiments/backfill_fingerprint.py --dry-run  # list what would change

A result computed before :mod:`jaxbsd.solver.fingerprint` existed records only ``solver_hash``, the
hash of the solver's source files (:data:`jaxbsd.io.SOLVER_FILES`). Where that hash equals the
current one, the result was computed by byte-identical solver sources, so the fingerprint
computed now is the one it ran with: it is added to the result's ``provenance`` with
``fingerprint_version`` and ``fingerprint_backfilled`` (saying at which commit it was
computed and why that is valid). Nothing else in the file changes; the file is rewritten only
if its JSON re-serializes to the very bytes it had (``indent=1``, the writer's format), so the
edit is the added keys and nothing else. Results of another solver hash are left alone and
listed: they must be regenerated.
"""

from __future__ import annotations

import argparse
import json
import sys

from jaxbsd.solver import fingerprint as fp
from jaxbsd.io import SOLVER_FILES, _git, source_hash

from checkout import ROOT, require_checkout_jaxbsd
from report import result_files


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    require_checkout_jaxbsd()
    current = source_hash(SOLVER_FILES)
    commit = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--", *SOLVER_FILES)  # run in jaxbsd/
    if dirty is None or dirty:
        print("the solver files have uncommitted changes (or this is not a git checkout): refusing", file=sys.stderr)
        return 1
    values = fp.solver_fingerprint(cache=False)
    last = _git("log", "-1", "--format=%H", "--", *SOLVER_FILES)
    note = (f"computed after the fact by experiments/backfill_fingerprint.py at commit {commit}, whose solver files "
            f"(solver_hash {current}, last changed at commit {last}) are byte-identical to the ones this result "
            "recorded")
    changed, skipped = [], []
    for path in result_files():
        raw = path.read_text()
        payload = json.loads(raw)
        prov = payload.get("provenance")
        if not isinstance(prov, dict) or "solver_hash" not in prov or "solver_fingerprint" in prov:
            continue
        if prov["solver_hash"] != current:
            skipped.append(path)
            continue
        if json.dumps(payload, indent=1) != raw:
            raise SystemExit(f"{path}: not in the writer's format (json indent=1); edit it by hand")
        prov.update({"fingerprint_version": fp.FINGERPRINT_VERSION, "solver_fingerprint": values,
                     "fingerprint_backfilled": note})
        if not args.dry_run:
            path.write_text(json.dumps(payload, indent=1))
        changed.append(path)
    for p in changed:
        print(f"{'would add' if args.dry_run else 'added'} fingerprint: {p.relative_to(ROOT)}")
    for p in skipped:
        print(f"other solver sources, regenerate: {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
