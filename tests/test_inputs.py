"""The bounded loader every input file goes through: limits, encodings and special files."""

import os
import re
from pathlib import Path
from typing import Any

import pytest

from dradriver.inputs import MAX_YAML_DEPTH, Fields, InputError, load_yaml_file, parse_yaml, read_text


def test_documents_load_as_json_would_see_them(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("---\nname: 2024-01-01\ndata: !!binary aGk=\n---\n---\n[1, 2]\n")
    assert load_yaml_file(path) == [{"name": "2024-01-01", "data": "aGk="}, [1, 2]]


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbfa: 1\n")
    assert load_yaml_file(path) == [{"a": 1}]


@pytest.mark.parametrize(
    ("special", "message"),
    [("/dev/zero", "not a regular file"), ("/dev/null", "not a regular file"), ("/", "is a directory")],
)
def test_special_files_are_refused_without_reading_them(special: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        read_text(Path(special))


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        load_yaml_file(fifo)


def test_a_file_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("a: " + "x" * 100)
    with pytest.raises(InputError, match="more than the limit of 50"):
        load_yaml_file(path, limit=50)


def test_bytes_that_are_not_utf8_are_located(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(InputError, match=r"not UTF-8 text \(byte 0xe9 at offset 9\); save it as UTF-8"):
        load_yaml_file(path)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"nope\.yaml: no such file"):
        load_yaml_file(tmp_path / "nope.yaml")


def test_nesting_is_limited_before_the_stack_is_exhausted() -> None:
    deep = "[" * 20000 + "]" * 20000
    with pytest.raises(InputError, match=f"deep.yaml: line 1: nested deeper than {MAX_YAML_DEPTH} levels"):
        parse_yaml(deep, source="deep.yaml")
    assert parse_yaml("[" * 50 + "]" * 50, source="ok.yaml")


def test_alias_expansion_is_limited() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    with pytest.raises(InputError, match=r"laughs\.yaml: expands to more than"):
        parse_yaml("\n".join(lines), source="laughs.yaml")


def test_an_alias_containing_itself_is_refused() -> None:
    with pytest.raises(InputError, match="expands to more than"):
        parse_yaml("&a [*a]", source="self.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a:\n\tb: 1\n", r"line 2, column 1: found character '\\t'"),
        ("!!python/object:os.system {}\n", "could not determine a constructor"),
        ("? [a]\n: b\n", "found unhashable key"),
    ],
)
def test_invalid_yaml_is_one_line_with_its_position(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as raised:
        parse_yaml(text, source="f.yaml")
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("raw", "read", "message"),
    [
        ({"a": 1, "b": 2}, lambda f: f.integer("a"), "x.b: Extra inputs are not permitted"),
        ({}, lambda f: f.integer("a"), "x.a: Field required"),
        ({"a": True}, lambda f: f.integer("a"), "x.a: Input should be a valid integer"),
        ({"a": -1}, lambda f: f.integer("a", ge=0), "x.a: Input should be greater than or equal to 0"),
        ({"a": 0}, lambda f: f.integer("a", gt=0), "x.a: Input should be greater than 0"),
        ({"a": 9}, lambda f: f.integer("a", le=8), "x.a: Input should be less than or equal to 8"),
        ({"a": 1}, lambda f: f.string("a"), "x.a: Input should be a valid string"),
        ({"a": "v"}, lambda f: f.string("a", pattern=re.compile(r"^\d$")), "x.a: String should match pattern"),
        ({"a": "yes"}, lambda f: f.boolean("a", False), "x.a: Input should be a valid boolean"),
        ({"a": {}}, lambda f: f.items("a"), "x.a: Input should be a valid tuple"),
        ({"a": [1, 2]}, lambda f: f.items("a", max_length=1), "x.a: Tuple should have at most 1 items"),
        ({"a": []}, lambda f: f.items("a", min_length=1), "x.a: Tuple should have at least 1 item after"),
        ([1], lambda f: None, "x: Input should be a valid dictionary"),
    ],
)
def test_fields_name_the_field_and_the_problem(raw: object, read: Any, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        fields = Fields(raw, "x")
        read(fields)
        fields.done()


def test_fields_give_defaults_and_each_entry_of_a_list_its_path() -> None:
    fields = Fields({"n": 3, "l": ["p", "q"]})
    assert (fields.integer("n"), fields.integer("m", 7), fields.string("s", ""), fields.boolean("b", True)) == (
        3,
        7,
        "",
        True,
    )
    assert fields.items("l") == [("l.0", "p"), ("l.1", "q")]
    fields.done()


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("a: 1\nb: {c: 1}\na: 2\n", 3),  # two objects pasted without ---
        ('{"spec": {}, "spec": {}}', 1),  # JSON: both on one line
        ("a:\n  b: 1\n  b: 2\n", 3),  # nested
    ],
)
def test_a_duplicate_field_is_refused_as_the_api_server_refuses_it(text: str, line: int) -> None:
    with pytest.raises(InputError, match=rf"^x\.yaml: line {line}: duplicate field \"\w+\" \(first at line \d\).*---"):
        parse_yaml(text, source="x.yaml")


def test_yaml_merge_keys_may_override_what_they_merge() -> None:
    assert parse_yaml("base: &b {x: 1}\nd:\n  <<: *b\n  x: 2\n", source="y") == [{"base": {"x": 1}, "d": {"x": 2}}]
