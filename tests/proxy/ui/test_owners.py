"""One session id, two owners: Alice and Bob start a conversation the same way,
so its id (made from how it starts) is the same, and each one's is a session
of its own. The dashboard addresses one owner's: the admin's links name the
owner, an ordinary visitor's name nobody and reach only their own.

The app in-process on a real SQLite file; each visitor is a client of its own
(its own cookies) on the same running app, and the store is asked directly
what the pages' buttons changed."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from compaction import session_key
from proxy.edge.access import owner_digest
from proxy.state.stores import SessionSettings
from tests.proxy.conftest import AppFactory
from tests.proxy.inprocess import InProcessProxy, RecordingTransport, running, settings_for
from tests.proxy.servers import FakeUpstream
from tests.proxy.session.conftest import figures_written, proxy_state
from tests.proxy.ui.test_pages import ADMIN, ALICE, BOB, MODELS, _chat, _csrf, _sign_in
from tests.synthetic import agent_session

ALICE_OWNER, BOB_OWNER = owner_digest(ALICE), owner_digest(BOB)


@dataclass(frozen=True)
class SharedId:
    """The running proxy and what each owner made under the one session id."""

    proxy: InProcessProxy
    session: str
    checkpoints: dict[str, str]  #: owner → the checkpoint their request made


@pytest.fixture
def shared(tmp_path: Path, fake_upstream: FakeUpstream) -> Iterator[SharedId]:
    settings = settings_for(
        models=MODELS,
        server={"admin_key": ADMIN},
        store={"url": f"sqlite:///{tmp_path / 'state.db'}"},
    )
    with running(settings, RecordingTransport(app=fake_upstream.app())) as proxy:
        messages = agent_session(seed=41, steps=60, task="Owners: one conversation start.")
        checkpoints = {
            owner: _chat(proxy, messages, key).headers["x-compaction-id"]
            for owner, key in ((ALICE_OWNER, ALICE), (BOB_OWNER, BOB))
        }
        assert checkpoints[ALICE_OWNER] != checkpoints[BOB_OWNER], "each compacted their own"
        _chat(proxy, messages, BOB)  # Bob asks twice, Alice once
        figures_written(proxy)
        yield SharedId(proxy, session_key(messages), checkpoints)


def _run(proxy: InProcessProxy, work: Any, *args: Any) -> Any:
    """``await work(*args)`` on the app's loop (its store is used there)."""
    return proxy.http.portal.call(work, *args)


def _settings(shared: SharedId, owner: str) -> SessionSettings:
    store = proxy_state(shared.proxy).store
    found: SessionSettings = _run(shared.proxy, store.session_settings, shared.session, owner)
    return found


def _signed_in(proxy: InProcessProxy, key: str) -> httpx.Client:
    client = proxy.client()
    assert _sign_in(client, key).status_code == 303
    return client


def _hrefs(page: str, css: str) -> list[str]:
    return [html.unescape(h) for h in re.findall(rf'<a class="{css}" href="([^"]+)"', page)]


def _action(page: str, form_id: str) -> str:
    found = re.search(rf'action="([^"]+)" id="{form_id}"', page)
    assert found, f"the page has the {form_id}"
    return html.unescape(found.group(1))


def test_the_admins_overview_links_each_owners_row_to_that_owners_session_alone(
    shared: SharedId,
) -> None:
    session = shared.session
    with _signed_in(shared.proxy, ADMIN) as admin:
        overview = admin.get("/ui").text
        links = _hrefs(overview, "mono session-link")
        assert sorted(links) == sorted(
            f"/ui/sessions/{session}?owner={owner}" for owner in (ALICE_OWNER, BOB_OWNER)
        )
        for owner, theirs in shared.checkpoints.items():
            other = next(c for o, c in shared.checkpoints.items() if o != owner)
            page = admin.get(f"/ui/sessions/{session}?owner={owner}")
            assert page.status_code == 200, page.text
            # That owner's checkpoint, events and request; the other's nowhere.
            assert f'id="checkpoint-{theirs}"' in page.text
            assert other not in page.text
            requests = 1 if owner == ALICE_OWNER else 2
            assert (
                f'<div class="value">{requests}</div><div class="label">requests</div>' in page.text
            )
            # Its buttons act on that owner's session; the other is a link away.
            for form in ("settings-form", "compact-form"):
                assert _action(page.text, form).endswith(f"?owner={owner}")
            assert _hrefs(page.text, "mono owner-link") == [
                f"/ui/sessions/{session}?owner={o}" for o in shared.checkpoints if o != owner
            ]


def test_settings_saved_through_the_admins_form_land_on_that_owners_session_only(
    shared: SharedId,
) -> None:
    session = shared.session
    with _signed_in(shared.proxy, ADMIN) as admin:
        page = admin.get(f"/ui/sessions/{session}?owner={BOB_OWNER}").text
        saved = admin.post(
            _action(page, "settings-form"),
            data={"csrf": _csrf(page), "instructions": "Keep Bob's paths."},
        )
        assert saved.status_code == 303
        assert saved.headers["location"] == f"/ui/sessions/{session}?owner={BOB_OWNER}"
        shown = admin.get(saved.headers["location"]).text
        assert "Keep Bob&#39;s paths.</textarea>" in shown and "compaction off" in shown
        alices = admin.get(f"/ui/sessions/{session}?owner={ALICE_OWNER}").text
        assert "Keep Bob" not in alices and "compaction off" not in alices
    bob = _settings(shared, BOB_OWNER)
    assert (bob.enabled, bob.instructions) == (False, "Keep Bob's paths.")
    assert _settings(shared, ALICE_OWNER) == SessionSettings()  # never set


def test_compact_now_through_the_admins_form_is_that_owners_alone(shared: SharedId) -> None:
    session = shared.session
    with _signed_in(shared.proxy, ADMIN) as admin:
        page = admin.get(f"/ui/sessions/{session}?owner={ALICE_OWNER}").text
        asked = admin.post(_action(page, "compact-form"), data={"csrf": _csrf(page)})
        assert asked.status_code == 303
        assert asked.headers["location"] == f"/ui/sessions/{session}?owner={ALICE_OWNER}"
        pending = "pending: the next request compacts"
        assert pending in admin.get(asked.headers["location"]).text
        assert pending not in admin.get(f"/ui/sessions/{session}?owner={BOB_OWNER}").text
    assert proxy_state(shared.proxy).compact_now == {(ALICE_OWNER, session)}


def test_the_admin_opening_a_shared_id_without_an_owner_picks_one_from_a_page(
    shared: SharedId,
) -> None:
    session = shared.session
    with _signed_in(shared.proxy, ADMIN) as admin:
        opened = admin.get(f"/ui/sessions/{session}")
        assert opened.status_code == 409
        assert opened.headers["content-type"].startswith("text/html")
        assert "Which caller's session?" in opened.text
        assert _hrefs(opened.text, "mono owner-link") == [
            f"/ui/sessions/{session}?owner={owner}" for owner in sorted((ALICE_OWNER, BOB_OWNER))
        ]
        # A button without an owner changes nothing, and offers the same choice.
        token = _csrf(opened.text)
        for action in ("settings", "compact"):
            posted = admin.post(
                f"/ui/sessions/{session}/{action}", data={"csrf": token, "instructions": "x"}
            )
            assert posted.status_code == 409, action
            assert "Nothing was changed." in posted.text and ALICE_OWNER in posted.text
    assert _settings(shared, ALICE_OWNER) == _settings(shared, BOB_OWNER) == SessionSettings()
    assert proxy_state(shared.proxy).compact_now == set()


def test_a_keyed_visitor_sees_only_their_own_and_naming_the_other_owner_is_the_404_page(
    shared: SharedId,
) -> None:
    session = shared.session
    with _signed_in(shared.proxy, ALICE) as alice:
        overview = alice.get("/ui").text
        # Her links name no owner, and Bob's digest is nowhere.
        assert _hrefs(overview, "mono session-link") == [f"/ui/sessions/{session}"]
        page = alice.get(f"/ui/sessions/{session}")
        assert page.status_code == 200
        assert f'id="checkpoint-{shared.checkpoints[ALICE_OWNER]}"' in page.text
        assert shared.checkpoints[BOB_OWNER] not in page.text
        assert _action(page.text, "settings-form") == f"/ui/sessions/{session}/settings"
        for shown in (overview, page.text):
            assert BOB_OWNER not in shown and ALICE_OWNER not in shown
        assert "other-owners" not in page.text  # not told another caller uses the id
        # Naming herself is her own page; naming Bob, the page of no session at all.
        assert alice.get(f"/ui/sessions/{session}?owner={ALICE_OWNER}").status_code == 200
        nowhere = alice.get("/ui/sessions/0123456789abcdef")
        theirs = alice.get(f"/ui/sessions/{session}?owner={BOB_OWNER}")
        assert theirs.status_code == nowhere.status_code == 404
        assert theirs.text == nowhere.text
        token = _csrf(page.text)
        for action in ("settings", "compact"):
            posted = alice.post(
                f"/ui/sessions/{session}/{action}?owner={BOB_OWNER}",
                data={"csrf": token, "instructions": "Alice was here."},
            )
            assert posted.status_code == 404, action
    assert _settings(shared, BOB_OWNER) == SessionSettings()
    assert proxy_state(shared.proxy).compact_now == set()


def test_the_admin_opening_an_id_one_owner_uses_gets_that_owners_session(
    start_app: AppFactory,
) -> None:
    proxy = start_app(models=MODELS, server={"admin_key": ADMIN})
    messages = agent_session(seed=42, steps=60, task="Owners: one owner only.")
    _chat(proxy, messages, ALICE)
    figures_written(proxy)
    session = session_key(messages)
    with _signed_in(proxy, ADMIN) as admin:
        page = admin.get(f"/ui/sessions/{session}")
        assert page.status_code == 200
        assert "Owners: one owner only." in page.text and "other-owners" not in page.text
        # The page names the owner it shows, so its buttons act on that one.
        assert _action(page.text, "settings-form").endswith(f"?owner={ALICE_OWNER}")
        saved = admin.post(
            _action(page.text, "settings-form"),
            data={"csrf": _csrf(page.text), "enabled": "on", "instructions": "Keep names."},
        )
        assert saved.status_code == 303
    store = proxy_state(proxy).store
    found = _run(proxy, store.session_settings, session, ALICE_OWNER)
    assert (found.enabled, found.instructions) == (True, "Keep names.")


def test_an_owner_longer_than_any_digest_is_refused_with_a_page(shared: SharedId) -> None:
    session, long = shared.session, "f" * 65
    with _signed_in(shared.proxy, ADMIN) as admin:
        token = _csrf(admin.get("/ui").text)
        opened = admin.get(f"/ui/sessions/{session}?owner={long}")
        assert opened.status_code == 400 and "The owner is longer than 64" in opened.text
        assert opened.headers["content-type"].startswith("text/html")
        posted = admin.post(f"/ui/sessions/{session}/compact?owner={long}", data={"csrf": token})
        assert posted.status_code == 400
        # A digest's length, but no owner's: the page of no such session.
        unknown = admin.get(f"/ui/sessions/{session}?owner={'0' * 32}")
        assert unknown.status_code == 404 and "No such session" in unknown.text
    assert proxy_state(shared.proxy).compact_now == set()


def test_the_admins_checkpoint_link_leads_to_its_owners_session(shared: SharedId) -> None:
    with _signed_in(shared.proxy, ADMIN) as admin:
        for owner, checkpoint_id in shared.checkpoints.items():
            found = admin.get(f"/ui/checkpoints/{checkpoint_id}")
            assert found.status_code == 303
            assert found.headers["location"] == (
                f"/ui/sessions/{shared.session}?owner={owner}#checkpoint-{checkpoint_id}"
            )
