"""Atomic result writes and result reads that name the path."""

import json

import pytest

from jaxbsd import io


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "r.json"
    io.write_json_atomic(path, {"a": 1})
    io.write_json_atomic(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]


def test_failed_write_keeps_the_previous_file(tmp_path, monkeypatch):
    """A crash after the new bytes are on disk but before they replace the file (the rename
    fails) leaves the previous file whole and no temporary behind."""
    path = tmp_path / "r.json"
    io.write_json_atomic(path, {"a": 1})
    written = []

    def failing_replace(src, dst):
        written.append(json.loads(open(src).read()))  # the new content was fully written first
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr(io.os, "replace", failing_replace)
    with pytest.raises(OSError, match="simulated crash"):
        io.write_json_atomic(path, {"a": 2})
    assert written == [{"a": 2}]
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


@pytest.mark.parametrize(
    "content, match",
    [("{\"a\": 1", "could not parse"), ("[1, 2]", "JSON object"), ("{\"a\": 1}", "missing \\['b'\\]")],
)
def test_read_json_errors_name_the_path(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=match) as info:
        io.read_json(path, required=["a", "b"])
    assert str(path) in str(info.value)


def test_read_json_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such results file"):
        io.read_json(tmp_path / "nope.json")
