"""Griffe extension for the API reference: the Sphinx roles of the docstrings become Markdown.

The docstrings cross-reference with Sphinx roles (:func:`decouple`, :class:`~jaxbsd.solver.jacobians.JacobianOperator`),
which MkDocs would show verbatim. Each becomes inline code, linked (mkdocs-autorefs) when it names a
documented jaxbsd object; ``~`` keeps only the last component, as in Sphinx.
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`(~?)([^`<>]+)`")


def _documented(pkg: griffe.Module, path: str) -> str | None:
    """The canonical path of a documented public jaxbsd object named ``path``, else None."""
    if not path.startswith(pkg.path + "."):
        return None
    try:
        obj = pkg[path[len(pkg.path) + 1:]]
        if obj.is_alias:
            obj = obj.final_target
    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None
    if any(part.startswith("_") for part in obj.path.split(".")) or not obj.docstring:
        return None
    return obj.path


def _rewrite(pkg: griffe.Module, obj: griffe.Object, match: re.Match) -> str:
    tilde, target = match.groups()
    target = target.strip().removesuffix("()")
    text = target.rsplit(".", 1)[-1] if tilde else target
    module = obj.module.path if not obj.is_module else obj.path
    owner = obj.parent.path if obj.parent is not None else module
    # As Sphinx: the name as given, then relative to the enclosing class or module, then the package.
    for candidate in (target, f"{owner}.{target}", f"{module}.{target}", f"{pkg.path}.{target}"):
        if (path := _documented(pkg, candidate)) is not None:
            return f"[`{text}`][{path}]"
    return f"`{text}`"


def _objects(obj: griffe.Object):
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)


class SphinxRoles(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = ROLE.sub(lambda m: _rewrite(pkg, obj, m), obj.docstring.value)
