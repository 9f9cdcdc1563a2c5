"""One module per family of generated tables; each registers its tables and figure sources
(:mod:`reporting.registry`). A new study is a new module here: nothing else is edited."""

from .. import committed
from ..registry import FOLDERS, KINDS, SOURCES


def result(name: str):
    """The committed result a figure names ``name`` (``"tf_deit"``), wrapped in its registered kind;
    None where the file is not committed. Tables that read another module's source use it."""
    path = (committed.BENCHMARKS if FOLDERS[name] == "benchmarks" else committed.RESULTS) / SOURCES[name]
    return KINDS[name](committed.read_json(path)) if path.exists() else None
