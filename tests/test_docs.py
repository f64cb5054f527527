"""The README and docs/ link only to files and headings that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")
#: ``[text](target)`` and ``![alt](target)``; the target ends at a space or ")".
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text without code: a link or heading shown inside code is not one."""
    return _FENCE.sub("", text)


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in _HEADING.findall(_prose(path.read_text())):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(path: Path) -> list[str]:
    return _LINK.findall(_CODE.sub("", _prose(path.read_text())))


def _broken(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: — not checked offline
            continue
        file_part, _, anchor = target.partition("#")
        destination = (page.parent / file_part).resolve() if file_part else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no such heading in {destination.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_an_existing_file_and_heading(page: Path) -> None:
    assert _broken(page) == []


def test_every_page_under_docs_is_linked_from_the_readme() -> None:
    linked = {target.partition("#")[0] for target in links(ROOT / "README.md")}
    for page in PAGES[1:]:
        assert f"docs/{page.name}" in linked, page.name


def test_the_slug_follows_githubs_rule() -> None:
    assert _slug("The `llm` summarizer") == "the-llm-summarizer"
    assert _slug("`/compact [instructions]`") == "compact-instructions"
    assert _slug("What is exposed, and to whom") == "what-is-exposed-and-to-whom"


def test_a_broken_link_is_reported(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[here](#title) [gone](missing.md) [nowhere](#no-such)\n")
    assert _broken(page) == ["missing.md: no such file", "#no-such: no such heading in page.md"]


def test_a_link_inside_code_is_not_checked(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("`[x](missing.md)`\n\n```\n[y](missing.md)\n# not a heading\n```\n")
    assert _broken(page) == []
    assert anchors(page) == set()


# --- comments give the reason, not a tracker number --------------------------

#: A tracker's word (issue, finding, observation) followed by its number, or
#: the word's possessive ("the issue" + "'s note"): a pointer into a tracker
#: the repository does not hold, so the reader learns nothing. (The spellings
#: are spelled out in ``test_a_citation_is_recognized_in_its_usual_spellings``.)
_CITATION = re.compile(
    r"\b(?:issues?|findings?|observations?)\b[\s,#]*\d|\b(?:issue|finding)'s\b", re.I
)
_CODE_DIRS = ("compaction", "config", "evaluation", "proxy", "tests", "docker")
_CODE_SUFFIXES = {".py", ".sh", ".toml", ".yaml", ".yml", ".env", ".cfg"}


def _code_files() -> list[Path]:
    files = [ROOT / "Makefile", ROOT / "pyproject.toml", ROOT / "docker" / "Dockerfile"]
    for folder in _CODE_DIRS:
        files += [
            path
            for path in (ROOT / folder).rglob("*")
            if path.suffix in _CODE_SUFFIXES and path.is_file() and ".venv" not in path.parts
        ]
    return [path for path in files if path.exists() and path != Path(__file__).resolve()]


def citations(text: str) -> list[str]:
    """Each line of ``text`` that cites an issue or finding by number."""
    return [line.strip() for line in text.splitlines() if _CITATION.search(line)]


def test_no_code_cites_an_issue_or_finding_by_number() -> None:
    found = {
        path.relative_to(ROOT).as_posix(): lines
        for path in _code_files()
        if (lines := citations(path.read_text(errors="replace")))
    }
    assert found == {}, "say the reason in words: a tracker number tells the next reader nothing"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_no_page_cites_an_issue_or_finding_by_number(page: Path) -> None:
    assert citations(page.read_text()) == []


def test_a_citation_is_recognized_in_its_usual_spellings() -> None:
    # Written with N for the numbers, so this file itself cites nothing.
    cited = (
        "# finding N\n(issue N, finding N)\nissues N and N\nIssue #N: why\n"
        "the issue"
        "'s note\nObservation N: an empty stream\n"
    ).replace("N", "7")
    assert len(citations(cited)) == 6
    assert citations("Facts needed to continue: values, identifiers, findings, outputs.") == []
    assert citations("the issue is that 3 tools ran") == []


def _cited_tests(text: str) -> list[tuple[str, str]]:
    """The tests a page cites as ``tests/…py::name`` (or ``::name`` or ``name``,
    of the file cited last), as (file, name) pairs."""
    cited: list[tuple[str, str]] = []
    current = ""
    for match in re.finditer(r"`(tests/[\w/]+\.py)?(?:::)?(test_\w+)?`", text):
        current = match.group(1) or current
        if match.group(2):
            cited.append((current, match.group(2)))
    return cited


def test_a_cited_test_is_read_with_its_file() -> None:
    text = "`tests/a.py::test_one`, `::test_two` and `test_three`; `tests/b.py` (`test_four`)"
    assert _cited_tests(text) == [
        ("tests/a.py", "test_one"),
        ("tests/a.py", "test_two"),
        ("tests/a.py", "test_three"),
        ("tests/b.py", "test_four"),
    ]


def test_every_test_the_security_section_cites_exists() -> None:
    """docs/operations.md names, for each class of attack, the test that holds it."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("### What holds it", 1)[1].split("\n### ", 1)[0]
    cited = _cited_tests(section)
    assert cited
    missing = [
        f"{path}::{name}"
        for path, name in cited
        if not re.search(rf"^(async )?def {name}\(", (ROOT / path).read_text(), re.M)
    ]
    assert missing == []
    files = re.findall(r"`(tests/[\w/]+\.py)", section)
    assert [path for path in files if not (ROOT / path).is_file()] == []
