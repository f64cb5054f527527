"""`compaction-proxy sessions` and `show SESSION` read the store the proxy writes."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from pathlib import Path

import pytest

from compaction import SUMMARY_MARKER, Checkpoint
from proxy.cli.commands import EXIT_INVALID, EXIT_OK, main
from proxy.state.stores import Event, RequestRecord, SessionSettings, open_store


def _record(session: str, at: float, **changes: object) -> RequestRecord:
    values: dict[str, object] = {
        "session": session,
        "owner": "ann",
        "model": "gpt-4o",
        "stage": "none",
        "reason": "threshold",
        "tokens_before": 5_000,
        "tokens_after": 5_000,
        "input_limit": 100_000,
        "trigger": 80_000,
        "status": 200,
        "ms": 42.0,
        "created_at": at,
    }
    values.update(changes)
    return RequestRecord(**values)  # type: ignore[arg-type]


async def _fill(url: str) -> str:
    store = open_store(url)
    now = time.time()
    summary = f"{SUMMARY_MARKER}\nSummary of 40 earlier messages.\n\n## Goal\n- Ship the parser."
    checkpoint = Checkpoint(
        session="aaa111",
        end_hash="h1",
        covered=40,
        replacement=({"role": "user", "content": summary},),
        stage="condensed",
        reason="threshold",
        tokens_before=90_000,
        tokens_after=9_000,
        id=uuid.uuid4().hex,
        created_at=now - 50,
    )
    await store.put(checkpoint, owner="ann")
    await store.add_event(
        Event(
            compaction_id="c1",
            type="context.compacted",
            session="aaa111",
            model="gpt-4o",
            reason="threshold",
            instance="i",
            stage="condensed",
            tokens_before=90_000,
            tokens_after=9_000,
            checkpoint_id=checkpoint.id,
            owner="ann",
        )
    )
    await store.record_requests(
        [
            _record(
                "aaa111",
                now - 60,
                tokens_before=70_000,
                tokens_after=70_000,
                task="Ship the parser",
            ),
            _record(
                "aaa111",
                now - 50,
                stage="condensed",
                tokens_before=90_000,
                tokens_after=9_000,
                context_window=128_000,
            ),
            _record("bbb222", now - 10, model="claude-x", api="anthropic"),
        ]
    )
    await store.set_session_settings("aaa111", "ann", SessionSettings(instructions="Keep paths."))
    await store.close()
    return checkpoint.id


@pytest.fixture
def config(tmp_path: Path) -> Path:
    url = f"sqlite://{tmp_path / 'state.db'}"
    asyncio.run(_fill(url))
    path = tmp_path / "proxy.toml"
    path.write_text(f'[store]\nurl = "{url}"\n')
    return path


def test_sessions_lists_the_newest_first_with_totals(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sessions", "--config", str(config)]) == EXIT_OK
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["SESSION", "LABEL", "MODEL", "REQUESTS"]
    assert lines[2].startswith("bbb222") and lines[3].startswith("aaa111")
    assert "Ship the parser" in lines[3]  # the task's first words
    # The context now against the model's window, and the limit and trigger apart.
    assert "9,000 / 128,000" in lines[3] and "100,000 / 80,000" in lines[3]
    assert "5,000 / ?" in lines[2]  # a window not recorded is not made up
    assert "81,000" in lines[3]  # tokens saved
    assert "2 sessions, 3 requests, 1 compactions, 81,000 tokens saved" in out


def test_show_prints_the_timeline_summary_settings_and_events(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["show", "aaa", "--config", str(config)]) == EXIT_OK  # a unique prefix
    out = capsys.readouterr().out
    assert out.startswith(
        "session aaa111 · owner ann\nShip the parser\n"
        "model gpt-4o (chat) · 2 requests · 1 compactions"
    )
    assert "context 9,000 / 128,000 window (limit 100,000, trigger 80,000)" in out
    assert "compaction: on · instructions: Keep paths." in out
    assert re.search(r"\n\S+ \S+ +condensed +threshold +90,000 +9,000 +200 +42\n", out)
    assert "## Goal\n- Ship the parser." in out
    assert SUMMARY_MARKER not in out
    assert "context.compacted" in out


def test_show_refuses_an_unknown_or_ambiguous_session(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["show", "zzz", "--config", str(config)]) == EXIT_INVALID
    assert "no session starting with 'zzz'" in capsys.readouterr().err


def test_sessions_on_an_empty_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text(f'[store]\nurl = "sqlite://{tmp_path / "empty.db"}"\n')
    assert main(["sessions", "--config", str(path)]) == EXIT_OK
    assert capsys.readouterr().out == "No sessions recorded yet.\n"


async def _two_owners(url: str) -> None:
    """One session id, two owners' sessions under it (their conversations
    started the same way): Ann asked twice, Bob three times."""
    store = open_store(url)
    now = time.time()
    records = [_record("ccc333", now - 30 + i, owner="ann", task="Ann's task") for i in range(2)]
    records += [_record("ccc333", now - 20 + i, owner="bob", task="Bob's task") for i in range(3)]
    await store.record_requests(records)
    await store.close()


def test_show_never_puts_two_owners_sessions_on_one_page(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = config.read_text().split('"')[1]
    asyncio.run(_two_owners(url))
    assert main(["sessions", "--config", str(config)]) == EXIT_OK
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("ccc333")]
    assert sorted(row.split()[-1] for row in rows) == ["ann", "bob"]  # each row names its owner

    assert main(["show", "ccc", "--config", str(config)]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert "2 owners'" in err and "ann (2 requests" in err and "bob (3 requests" in err
    assert "--owner" in err

    assert main(["show", "ccc", "--owner", "bo", "--config", str(config)]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith("session ccc333 · owner bob\nBob's task\n")
    assert "· 3 requests ·" in out
    assert "Timeline (the last 3 of 3 requests)" in out  # the header's count, Bob's alone
    assert "Ann's task" not in out


def test_show_names_an_owner_that_has_no_session_under_the_id(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["show", "aaa", "--owner", "bob", "--config", str(config)]) == EXIT_INVALID
    assert (
        "no session starting with 'aaa' of an owner starting with 'bob'" in capsys.readouterr().err
    )
