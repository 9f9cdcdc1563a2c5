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


def test_failed_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "r.json"
    io.write_json_atomic(path, {"a": 1})
    with pytest.raises(TypeError):
        io.write_json_atomic(path, {"a": object()})  # not serializable: fails before any byte is written
    assert json.loads(path.read_text()) == {"a": 1}
    assert len(list(tmp_path.iterdir())) == 1


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
