from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction.budget.profile import Profile
from compaction.chat.own import SUMMARY_MARKER, recorded
from compaction.summary.blocks import block_lines
from compaction.summary.files import (
    FileLists,
    collect_files,
    files_of_call,
    parse_file_lists,
    render_file_lists,
    strip_file_lists,
)
from tests.conftest import assistant, tool_group, user

PROFILE = Profile()


def call(name: str, **arguments: object) -> dict[str, object]:
    return {
        "id": "c1",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


# --- tool calls --------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("read_file", {"path": "src/a.py"}, FileLists(("src/a.py",))),
        ("readFile", {"file_path": "src/a.py"}, FileLists(("src/a.py",))),
        ("open", {"path": "tests/x.py", "line_number": 3}, FileLists(("tests/x.py",))),
        ("edit_file", {"target_file": "a.py", "old": "x"}, FileLists((), ("a.py",))),
        ("write_to_file", {"filename": "notes"}, FileLists((), ("notes",))),
        ("create", {"filename": "reproduce.py"}, FileLists((), ("reproduce.py",))),
        ("str_replace_editor", {"command": "view", "path": "a.py"}, FileLists(("a.py",))),
        ("str_replace_editor", {"command": "create", "path": "b.py"}, FileLists((), ("b.py",))),
        ("multi_read", {"paths": ["a.py", "b.py"]}, FileLists(("a.py", "b.py"))),
        ("bash", {"command": "sed -i s/a/b/ c.py"}, FileLists((), ("c.py",))),
        ("execute_command", {"cmd": "cat d.py"}, FileLists(("d.py",))),
        ("list_tools", {"path": "x.py"}, FileLists(("x.py",))),
        ("get_user_details", {"user_id": "sara_1"}, FileLists()),
        ("fetch_tools", {"path": "y.py"}, FileLists()),  # "ls" is no word of "tools"
    ],
)
def test_files_of_call(tool: str, arguments: dict[str, object], expected: FileLists) -> None:
    assert files_of_call(call(tool, **arguments), PROFILE) == expected


def test_tool_words_come_from_the_profile() -> None:
    profile = Profile(read_tools=("fetch",), modify_tools=("scribble",))
    assert files_of_call(call("fetch_doc", path="a.md"), profile) == FileLists(("a.md",))
    assert files_of_call(call("scribble", path="b.md"), profile) == FileLists((), ("b.md",))
    assert files_of_call(call("read_file", path="c.md"), profile) == FileLists()


def test_malformed_arguments_give_nothing() -> None:
    bad = {"id": "c", "function": {"name": "read_file", "arguments": "{not json"}}
    assert files_of_call(bad, PROFILE) == FileLists()


def previous_summary(read: list[str], modified: list[str]) -> dict[str, object]:
    lists = render_file_lists(FileLists(tuple(read), tuple(modified)))
    return recorded(
        user(f"{SUMMARY_MARKER}\nSummary of 3 earlier messages.\n\n## Goal\n- x\n\n{lists}")
    )


def test_collect_files_merges_previous_summary_in_order() -> None:
    messages = [
        previous_summary(["old/read.py", "both.py"], ["old/changed.py"]),
        *tool_group("read_file", {"path": "new/read.py"}),
        *tool_group("bash", {"command": "sed -i s/a/b/ both.py"}),
        *tool_group("bash", {"command": "cat old/changed.py"}),
        assistant("done"),
    ]
    before = copy.deepcopy(messages)
    lists = collect_files(messages, PROFILE)
    assert lists == FileLists(("old/read.py", "new/read.py"), ("old/changed.py", "both.py"))
    assert messages == before


def test_collect_files_skips_paths_that_do_not_exist() -> None:
    messages = tool_group(
        "bash",
        {"command": "cat wrong/a.py"},
        "<returncode>1</returncode>\n<output>\ncat: wrong/a.py: No such file or directory\n"
        "</output>",
    )
    assert collect_files(messages, PROFILE) == FileLists()


def test_pathless_edit_applies_to_the_open_file() -> None:
    messages = [
        *tool_group("open", {"path": "src/fields.py", "line_number": 10}),
        *tool_group("edit", {"search": "a", "replace": "b"}),
    ]
    assert collect_files(messages, PROFILE) == FileLists((), ("src/fields.py",))


def test_collect_files_keeps_the_newest_when_over_the_limit() -> None:
    messages = [m for i in range(12) for m in tool_group("read_file", {"path": f"f{i}.py"})]
    lists = collect_files(messages, PROFILE, max_files=5)
    assert lists.read == ("f7.py", "f8.py", "f9.py", "f10.py", "f11.py")


# --- rendering and parsing ---------------------------------------------------


def test_render_and_parse_round_trip() -> None:
    lists = FileLists(("a.py", "docs/b.md"), ("c/d.py",))
    text = render_file_lists(lists)
    assert text == (
        "<read-files>\na.py\ndocs/b.md\n</read-files>\n<modified-files>\nc/d.py\n</modified-files>"
    )
    assert parse_file_lists(f"summary\n\n{text}\n") == lists
    assert strip_file_lists(f"summary\n\n{text}\n") == "summary"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # A block on lines of its own goes with its lines: no blank line is left.
        ("A\n<read-files>\na.py\n</read-files>\nB", "A\nB"),
        # Text before the opener and after the closer each stay a line.
        ("Read <read-files>a.py</read-files> and fixed it.", "Read \n and fixed it."),
        ("Read <read-files>\na.py\n</read-files>\nB", "Read \nB"),
        ("A\n<read-files>a.py</read-files> fixed.", "A\n fixed."),
        ("x <read-files>a</read-files><modified-files>b</modified-files> y", "x \n y"),
        ("A\r\n<read-files>\r\na.py\r\n</read-files>\r\nB", "A\r\nB"),
        # Pieces of a tag either side of a block are not joined into the tag.
        ("<err<read-files>a.py</read-files>ors>\nX\n</errors>", "<err\nors>\nX\n</errors>"),
        # The text after a closer keeps its line, so it reads as it would have
        # with the block on lines of its own: here it opens the errors block.
        ("<errors><read-files>a.py</read-files>X\n</errors>", "<errors>\nX\n</errors>"),
        # An opener with no closer after it is no block.
        ("A <read-files>\na.py", "A <read-files>\na.py"),
    ],
)
def test_stripping_a_block_keeps_the_lines_around_it(text: str, expected: str) -> None:
    assert strip_file_lists(text) == expected


#: What a summary's lines hold: prose, the ledger's tags and pieces of them,
#: stray closers of the file blocks (never an opener: that would make a block).
_PIECES = [
    "x", "a.py", " ", "prose", "<", ">", "ors>", "<err", "files>", "<errors>", "</errors>",
    "<commands>", "</commands>", "<identifiers>", "<user-messages>", "</user-messages>",
    "<user-message>", "</user-message>", "</read-files>", "</modified-files>",
]  # fmt: skip
_BODY_PIECES = [p for p in _PIECES if p not in ("</read-files>", "</modified-files>")] + [
    "\n",
    "<read-files>",
    "<modified-files>",
]


@st.composite
def _file_block(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["read", "modified"]))
    body = "".join(draw(st.lists(st.sampled_from(_BODY_PIECES), max_size=6)))
    return f"<{kind}-files>{body}</{kind}-files>"


#: A line: text pieces (str) and file blocks (a one-item tuple), which may
#: span lines of their own.
_line = st.lists(st.sampled_from(_PIECES) | _file_block().map(lambda block: (block,)), max_size=6)


def _line_text(line: list[str | tuple[str]]) -> str:
    return "".join(part if isinstance(part, str) else part[0] for part in line)


def _without_blocks(line: list[str | tuple[str]]) -> list[str]:
    """The lines ``line`` leaves without its file blocks: itself when it has
    none, else each stretch of text between them that is not empty."""
    if all(isinstance(part, str) for part in line):
        return [_line_text(line)]
    stretches, current = [], ""
    for part in line:
        if isinstance(part, str):
            current += part
        else:
            stretches.append(current)
            current = ""
    return [text for text in (*stretches, current) if text]


@settings(max_examples=400, deadline=None)
@given(st.lists(_line, max_size=8))
def test_stripping_leaves_the_lines_there_were_less_the_blocks(
    lines: list[list[str | tuple[str]]],
) -> None:
    text = "\n".join(_line_text(line) for line in lines)
    expected = "\n".join(kept for line in lines for kept in _without_blocks(line)).strip()
    stripped = strip_file_lists(text)
    assert list(block_lines(stripped)) == list(block_lines(expected))
    assert stripped == expected


def test_render_leaves_out_empty_blocks() -> None:
    assert render_file_lists(FileLists()) == ""
    assert (
        render_file_lists(FileLists((), ("x.py",))) == "<modified-files>\nx.py\n</modified-files>"
    )


def test_parse_drops_from_read_what_was_modified() -> None:
    text = "<read-files>\na.py\nb.py\n</read-files>\n<modified-files>\na.py\n</modified-files>"
    assert parse_file_lists(text) == FileLists(("b.py",), ("a.py",))
    assert parse_file_lists("no blocks here") == FileLists()


def test_merge() -> None:
    merged = FileLists(("a", "b"), ("c",)).merge(FileLists(("c", "d"), ("b",)))
    assert merged == FileLists(("a", "d"), ("c", "b"))
    assert not FileLists()
    assert FileLists(("a",))
