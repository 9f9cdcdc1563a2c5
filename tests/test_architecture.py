"""The architecture as CI checks it (docs/architecture.md): the import contracts of
``pyproject.toml``'s ``[tool.importlinter]`` hold, they fail when an import breaks them, and no
two modules of ``jaxbsd``, ``benchmarks`` or the results layer (``experiments/reporting``) import
each other, directly or around a loop.
"""

from __future__ import annotations

import copy
import pathlib
import shutil
import subprocess
import sys
import tomllib

import grimp
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]  # on sys.path: pyproject's pytest pythonpath
PACKAGES = ("jaxbsd", "benchmarks", "experiments.reporting")  # experiments/: a namespace package
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
NAMES = {c["id"]: c["name"] for c in CONTRACTS}


def test_lint_imports_passes():
    """What CI runs after ruff (.ci/run), from the repository root."""
    exe = shutil.which("lint-imports")
    cmd = [exe] if exe else [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                                                   "sys.exit(lint_imports_command())"]
    proc = subprocess.run([*cmd, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"Contracts: {len(NAMES)} kept, 0 broken." in proc.stdout, proc.stdout[-4000:]


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _describe(graph: grimp.ImportGraph, component: list[str]) -> str:
    lines = []
    for importer in component:
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & set(component)):
            for d in graph.get_import_details(importer=importer, imported=imported):
                lines.append(f"  {importer}:{d['line_number']} imports {imported} ({d['line_contents']})")
    return "\n".join(lines)


def test_no_import_cycles_between_modules():
    """Every module counts, package ``__init__`` files included (which import-linter's
    ``acyclic_siblings`` does not look at: a submodule importing its own package), and imports
    inside functions count as much as those at the top."""
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n\n".join(_describe(graph, c) for c in cycles)


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    graph.add_import(importer="jaxbsd.solver.bspline", imported="jaxbsd.solver.bases")  # bases imports bspline
    assert ["jaxbsd.solver.bases", "jaxbsd.solver.bspline"] in _cycles(graph)


# Imports the contracts forbid, planted into the real graph: (importer, imported, the contracts it must break).
PLANTS = [
    ("jaxbsd.solver.bases", "jaxbsd.models.vit", {"solver-core", "layers"}),
    ("jaxbsd.solver.fingerprint", "jaxbsd.data", {"solver-core", "layers"}),
    ("jaxbsd.models.vit", "jaxbsd.compression", {"models", "layers"}),
    ("jaxbsd.models.lm", "jaxbsd.training", {"models", "layers"}),
    ("jaxbsd.training", "jaxbsd.cli.args", {"cli", "layers"}),
    ("jaxbsd.data", "jaxbsd.checkpoint", {"layers"}),
    ("benchmarks.common", "benchmarks.run", {"benchmarks-layers", "acyclic"}),
    ("experiments.reporting.stats", "experiments.reporting.figures", {"reporting-layers", "acyclic"}),
    ("experiments.reporting.committed", "experiments.reporting.registry", {"reporting-layers"}),
    ("experiments.reporting.tables.lm", "jax", {"reporting-no-jax"}),
    ("experiments.reporting.figures", "jaxbsd.solver.fingerprint", {"reporting-no-jax"}),
    ("experiments.reporting.stale", "jaxbsd.io", {"reporting-no-jax"}),
    # the engine's own layers: upward, and between the independent modules of one layer
    ("jaxbsd.compression.sites", "jaxbsd.compression.engine", {"compression-layers"}),
    ("jaxbsd.compression.methods.prune", "jaxbsd.compression.refine", {"compression-layers"}),
    ("jaxbsd.compression.refine", "jaxbsd.compression.budget", {"compression-layers"}),
    ("jaxbsd.compression.surgery", "jaxbsd.compression.specs", {"compression-layers"}),
]


@pytest.fixture(scope="module")
def report():
    """``report(plant)``: import-linter's report on the real graph plus the import ``plant``
    (None: none), with this repository's contracts; the graph is built once."""
    from importlinter import configuration
    from importlinter.application import use_cases
    from importlinter.application.app_config import settings
    from importlinter.contracts import acyclic_siblings, forbidden, layers, protected
    from importlinter.domain.contract import registry

    configuration.configure()
    for kind, cls in [("forbidden", forbidden.ForbiddenContract), ("layers", layers.LayersContract),
                      ("protected", protected.ProtectedContract),
                      ("acyclic_siblings", acyclic_siblings.AcyclicSiblingsContract)]:
        registry.register(cls, kind)  # what lint-imports registers before it reads the contracts
    real = grimp.build_graph(*PACKAGES, cache_dir=None, include_external_packages=True)  # as pyproject.toml asks
    previous = settings.GRAPH_BUILDER

    class Planted:
        plant: tuple[str, str] | None = None

        def build(self, root_package_names, cache_dir=None, include_external_packages=False,
                  exclude_type_checking_imports=False):
            assert sorted(root_package_names) == sorted(PACKAGES)
            graph = copy.deepcopy(real)
            if self.plant is not None:
                graph.add_import(importer=self.plant[0], imported=self.plant[1], line_number=1,
                                 line_contents="(planted)")
            return graph

    builder = Planted()
    settings.configure(GRAPH_BUILDER=builder)
    options = use_cases.read_user_options(str(ROOT / "pyproject.toml"))

    def run(plant):
        builder.plant = plant
        return {contract.name: check for contract, check in use_cases.create_report(options, cache_dir=None)
                .get_contracts_and_checks()}

    yield run
    settings.configure(GRAPH_BUILDER=previous)


@pytest.mark.parametrize("importer, imported, broken", PLANTS, ids=[f"{a}->{b}" for a, b, _ in PLANTS])
def test_a_planted_import_breaks_the_contracts(report, importer, imported, broken):
    before, after = report(None), report((importer, imported))
    assert set(after) == set(NAMES.values())
    newly = {cid for cid, name in NAMES.items()
             if not after[name].kept and (before[name].kept or after[name].metadata != before[name].metadata)}
    # others may break too: an upward import usually closes a loop (acyclic), and can open an indirect
    # path from a lower to a higher layer elsewhere
    assert broken <= newly, f"{importer} -> {imported} should break {sorted(broken)}, broke {sorted(newly)}"


def _picture() -> list[str]:
    """The paths of docs/architecture.md's picture of the layers (its first ``text`` block), as
    ``jaxbsd/...`` paths: folders end in ``/``."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("```text\n", 1)[1].split("```", 1)[0]
    paths, stack = [], []
    for line in block.splitlines()[1:]:  # the first line is the package, "jaxbsd/"
        name = line.strip().split(" ", 1)[0]
        if not name or not (name.endswith("/") or name.endswith(".py")):
            continue
        depth = (len(line) - len(line.lstrip())) // 2 - 1
        stack = stack[:depth] + [name]
        paths.append("jaxbsd/" + "".join(stack))
    return paths


def test_the_architecture_picture_names_what_exists_and_every_module_has_a_place():
    named = _picture()
    assert "jaxbsd/solver/" in named and "jaxbsd/models/bert/" in named, named
    missing = [p for p in named if not (ROOT / p).exists()]
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"
    folders = {p for p in named if p.endswith("/")}
    files = {p for p in named if p.endswith(".py")}
    homeless = []
    for module in sorted((ROOT / "jaxbsd").rglob("*.py")):
        rel = module.relative_to(ROOT).as_posix()
        if rel in files or rel == "jaxbsd/__init__.py":
            continue
        folder = rel.rsplit("/", 1)[0] + "/"
        if folder not in folders:
            homeless.append(rel)
    assert not homeless, f"modules in no folder of docs/architecture.md's picture: {homeless}"
