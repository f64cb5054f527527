"""The dashboard's pages, rendered on the server (Jinja2, autoescaped).

* ``GET  /ui`` — the overview; ``GET /ui/sessions/{session}`` — one conversation;
* ``POST /ui/sessions/{session}/settings`` and ``/compact``,
  ``POST /ui/checkpoints/{id}`` — the buttons (CSRF-checked, then back to the page);
  ``GET /ui/checkpoints/{id}`` — to the checkpoint on its session's page;
* ``GET/POST /ui/login``, ``POST /ui/logout`` (which ends the session on the
  server too, :meth:`proxy.ui.auth.Signer.sign_out`).

A session or checkpoint the visitor has nothing of — none such, or another
caller's — is a 404 page, the same in both cases, so that it tells nobody
whether another caller's exists.

Two callers may use one session id (it is made from how the conversation
starts), and each one's is a session of its own. The admin's links carry the
owner (``?owner=<owner>`` on the session page and its two buttons, as on the
JSON routes); the admin opening an id several owners use without one gets a
page listing them to pick from (409), never a guess. Any other visitor's
links name no owner: they see only their own, and naming another owner is the
404 page. A form larger than ``server.max_form_bytes``
(refused as it streams in, :class:`proxy.edge.body.BodyLimit`) is a 413 page;
a session id, instructions or a summary over its length limit a 400 page.

No script, no build step, nothing fetched from elsewhere: the styles are
inlined from ``templates/style.css`` and the charts are inline SVG.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any, Final
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from jinja2 import Environment, PackageLoader, select_autoescape
from markdown_it import MarkdownIt
from markupsafe import Markup

from proxy.edge.errors import BadRequest, NotFound, PayloadTooLarge
from proxy.flow.services import services_of
from proxy.session import steering
from proxy.state.stores.figures import SAVINGS_BUCKET_SECONDS
from proxy.ui.auth import ANONYMOUS, COOKIE, Signer, SignInRequired, Visitor
from proxy.ui.charts import Mark, Rule, Series, line_chart, tokens
from proxy.ui.views import (
    MAX_OWNER_CHARS,
    Overview,
    SessionView,
    read_overview,
    read_session,
)

#: The owners of one session id the admin is offered to pick from.
OWNERS_LISTED: Final = 100
#: The newest requests listed, with their cost, on a session's page.
REQUESTS_LISTED: Final = 100


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("proxy.ui", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # Raw HTML in a summary is shown as text, never run: html=False.
    markdown = MarkdownIt("commonmark", {"html": False, "linkify": False})
    env.filters["markdown"] = lambda text: Markup(markdown.render(text or ""))
    env.filters["tokens"] = lambda n: f"{n:,}" if isinstance(n, int) else n
    env.filters["short"] = tokens
    env.filters["clock"] = lambda t: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    env.filters["pct"] = lambda part, whole: f"{100 * part / whole:.0f}%" if whole else "–"
    env.filters["usd"] = _dollars
    env.filters["exact"] = lambda cost: f"{cost:,.1f}"
    return env


def _dollars(amount: float) -> str:
    """``$1,234.56``; a cent's fractions where that is all there is."""
    return f"${amount:,.2f}" if abs(amount) >= 0.01 or amount == 0 else f"${amount:.4f}"


def _overview_chart(overview: Overview) -> str:
    """Cumulative tokens saved: from zero at the first hour's start, each hour's
    savings added at its end (or now, for the hour under way)."""
    if not overview.savings:
        return line_chart([], label="Tokens saved over time")
    now = time.time()
    running, points = 0, [(overview.savings[0][0], 0.0)]
    for bucket, saved in overview.savings:
        running += saved
        points.append((min(bucket + SAVINGS_BUCKET_SECONDS, now), float(running)))
    line = Series("tokens saved", points, css="saved")
    return line_chart([line], label="Tokens saved over time (cumulative)")


def _session_chart(view: SessionView) -> str:
    """Every request's context as received and as sent, the latest trigger and
    limit, and a circle where a compaction was made."""
    requests = view.requests
    received = Series(
        "received", [(r.created_at, float(r.tokens_before)) for r in requests], "received"
    )
    sent = Series("sent", [(r.created_at, float(r.tokens_after)) for r in requests])
    marks = [
        Mark(
            r.created_at,
            float(r.tokens_after),
            f"{r.stage} ({r.reason}): {r.tokens_before:,} → {r.tokens_after:,} tokens",
        )
        for r in requests
        if r.compacted
    ]
    rules = []
    if requests:
        latest = requests[-1]
        rules = [
            Rule("limit", float(latest.input_limit), "limit"),
            Rule("trigger", float(latest.trigger), "trigger"),
        ]
    return line_chart(
        [received, sent], label="Context size of every request", rules=rules, marks=marks
    )


class _PageRoute(APIRoute):
    """A dashboard route whose refusals of what was sent — a form over its
    size limit, a field or a path over its length limit — are pages too.

    Its endpoint is a method of :class:`Pages`, whose page it renders them with."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        pages: Pages = self.endpoint.__self__  # type: ignore[attr-defined]

        async def answered(request: Request) -> Response:
            try:
                return await handler(request)
            except (BadRequest, PayloadTooLarge) as exc:
                return pages.refused(request, exc)

        return answered


class Pages:
    """The dashboard's endpoints, over one template environment and the
    :class:`~proxy.ui.auth.Signer` that knows who is visiting."""

    def __init__(self, signer: Signer) -> None:
        self.signer = signer
        self.env = _environment()

    def router(self) -> APIRouter:
        """The routes, as a table: method, path, endpoint."""
        router = APIRouter(prefix="/ui", route_class=_PageRoute)
        table: list[tuple[str, str, Callable[..., Coroutine[Any, Any, Response]]]] = [
            ("GET", "", self.overview),
            ("GET", "/sessions/{session}", self.session),
            ("POST", "/sessions/{session}/settings", self.settings),
            ("POST", "/sessions/{session}/compact", self.compact),
            ("POST", "/checkpoints/{checkpoint_id}", self.edit),
            ("GET", "/checkpoints/{checkpoint_id}", self.checkpoint),
            ("GET", "/login", self.login_page),
            ("POST", "/login", self.login),
            ("POST", "/logout", self.logout),
            ("GET", "/{anything:path}", self.elsewhere),
        ]
        for method, path, endpoint in table:
            kind = HTMLResponse if method == "GET" else None
            router.add_api_route(path, endpoint, methods=[method], response_class=kind or Response)
        return router

    # The parts every page uses.

    def refused(self, request: Request, exc: BadRequest | PayloadTooLarge) -> Response:
        cookie = request.cookies.get(COOKIE)
        role = self.signer.role_of(cookie) or ANONYMOUS
        shown = ANONYMOUS if role.startswith(ANONYMOUS) else role
        visitor = Visitor(None, shown, cookie or "", fresh=False)
        return self.page("refused.html", visitor, status=exc.status, message=exc.message)

    def page(self, name: str, visitor: Visitor, status: int = 200, **values: Any) -> Response:
        body = self.env.get_template(name).render(
            csrf=self.signer.csrf(visitor.cookie), role=visitor.role, **values
        )
        response = HTMLResponse(body, status_code=status, headers=_SECURITY_HEADERS)
        if visitor.fresh:
            _set_cookie(response, visitor.cookie, self.signer.max_age)
        return response

    def missing(self, visitor: Visitor, what: str) -> Response:
        return self.page("missing.html", visitor, status=404, what=what)

    async def steered(self, request: Request, visitor: Visitor, session: str) -> str | Response:
        """The owner whose ``session`` the page shows or its buttons steer —
        the one the address names (``?owner=``), else the visitor's own, else
        (the admin) the one owner of that id — or the page to answer instead:
        the 404 page, or the admin's choice between the id's owners."""
        services = services_of(request)
        owner = request.query_params.get("owner")  # absent: none named; even "" is a name
        if owner is not None and len(owner) > MAX_OWNER_CHARS:
            raise BadRequest(
                f"The owner is longer than {MAX_OWNER_CHARS} characters.", param="owner"
            )
        try:
            return await steering.steered_session(
                services.conversations, session, visitor.viewer, owner
            )
        except NotFound:
            return self.missing(visitor, "session")
        except steering.AmbiguousSession:
            return await self.choose_owner(request, visitor, session)

    async def choose_owner(self, request: Request, visitor: Visitor, session: str) -> Response:
        """The admin's page for a session id several owners use: each owner,
        with what of theirs is recorded, as a link to their session (nothing
        done, for a button)."""
        store = services_of(request).conversations.store
        owners = await store.owners_of_session(session)
        recorded = {s.owner: s for s in await store.sessions() if s.session == session}
        rows = [(owner, recorded.get(owner)) for owner in owners[:OWNERS_LISTED]]
        return self.page(
            "owners.html",
            visitor,
            status=409,
            session=session,
            rows=rows,
            count=len(owners),
            posted=request.method == "POST",
        )

    async def form(self, request: Request, visitor: Visitor) -> dict[str, str]:
        raw = await request.body()  # bounded as it streams in (BodyLimit)
        fields = {k: v[0] for k, v in parse_qs(raw.decode("utf-8", "replace")).items()}
        # parse_qs drops blank values: a cleared field must still arrive.
        for name in ("instructions", "summary", "key", "proxy_key"):
            if f"{name}=".encode() in raw and name not in fields:
                fields[name] = ""
        self.signer.check_post(request, visitor.cookie, fields.get("csrf"))
        return fields

    async def checkpoint_owner_query(
        self, request: Request, visitor: Visitor, checkpoint_id: str
    ) -> str:
        """For the admin, the checkpoint's session page is its owner's."""
        if not _is_admin(visitor):
            return ""
        owner = await services_of(request).conversations.store.owner_of(checkpoint_id)
        return _owner_query(visitor, owner) if owner is not None else ""

    # The endpoints.

    async def overview(self, request: Request) -> Response:
        visitor = self.signer.visitor(request)
        # Who is not signed in sees the keyless callers' sessions, and how many
        # of those that send a key there are (their number, nothing of theirs).
        data = await read_overview(
            services_of(request).conversations.store,
            visitor.viewer,
            count_hidden=visitor.role == ANONYMOUS,
        )
        chart = Markup(_overview_chart(data))
        # Only the admin's rows are of several owners, so only theirs name one.
        return self.page(
            "overview.html", visitor, overview=data, chart=chart, owned=_is_admin(visitor)
        )

    async def session(self, session: str, request: Request) -> Response:
        visitor = self.signer.visitor(request)
        services = services_of(request)
        owner = await self.steered(request, visitor, session)
        if isinstance(owner, Response):
            return owner
        view = await read_session(services.conversations.store, session, visitor.viewer, owner)
        pending = (owner, session) in services.conversations.compact_now
        chart = Markup(_session_chart(view))
        others: list[str] = []
        if _is_admin(visitor):
            owners = await services.conversations.store.owners_of_session(session)
            others = [other for other in owners if other != owner][:OWNERS_LISTED]
        return self.page(
            "session.html",
            visitor,
            view=view,
            chart=chart,
            pending=pending,
            # The buttons act on the owner shown, even if another starts using the id.
            owner_query=_owner_query(visitor, owner),
            others=others,
            REQUESTS_LISTED=REQUESTS_LISTED,
        )

    async def settings(self, session: str, request: Request) -> Response:
        visitor = self.signer.visitor(request)
        fields = await self.form(request, visitor)
        services = services_of(request)
        owner = await self.steered(request, visitor, session)
        if isinstance(owner, Response):
            return owner
        await steering.update_settings(
            services.conversations,
            session,
            owner,
            enabled=fields.get("enabled") == "on",
            instructions=fields.get("instructions", ""),
        )
        return _back(session, _owner_query(visitor, owner))

    async def compact(self, session: str, request: Request) -> Response:
        visitor = self.signer.visitor(request)
        await self.form(request, visitor)
        services = services_of(request)
        owner = await self.steered(request, visitor, session)
        if isinstance(owner, Response):
            return owner
        steering.compact_now(services.conversations, session, owner)
        return _back(session, _owner_query(visitor, owner))

    async def edit(self, checkpoint_id: str, request: Request) -> Response:
        visitor = self.signer.visitor(request)
        fields = await self.form(request, visitor)
        services = services_of(request)
        try:
            edited = await steering.edit_summary(
                services.conversations, checkpoint_id, fields.get("summary", ""), visitor.viewer
            )
        except NotFound:
            return self.missing(visitor, "checkpoint")
        query = await self.checkpoint_owner_query(request, visitor, edited.id)
        return _back(edited.session, query, f"checkpoint-{edited.id}")

    async def checkpoint(self, checkpoint_id: str, request: Request) -> Response:
        visitor = self.signer.visitor(request)
        found = await services_of(request).conversations.store.get(
            checkpoint_id, owner=visitor.viewer
        )
        if found is None:
            return self.missing(visitor, "checkpoint")
        query = await self.checkpoint_owner_query(request, visitor, found.id)
        return _back(found.session, query, f"checkpoint-{found.id}")

    async def login_page(self, request: Request) -> Response:
        cookie = request.cookies.get(COOKIE)
        fresh = self.signer.role_of(cookie) is None or cookie is None
        cookie = self.signer.anonymous_cookie() if fresh or cookie is None else cookie
        visitor = Visitor(None, "anon", cookie, fresh)
        return self.page("login.html", visitor, needs_proxy_key=self.signer.needs_proxy_key)

    async def login(self, request: Request) -> Response:
        cookie = request.cookies.get(COOKIE) or ""
        visitor = Visitor(None, "anon", cookie, fresh=False)
        fields = await self.form(request, visitor)
        role = self.signer.sign_in(fields.get("key", ""), fields.get("proxy_key", ""))
        response = RedirectResponse("/ui", status_code=303)
        _set_cookie(response, self.signer.cookie(role), self.signer.max_age)
        return response

    async def logout(self, request: Request) -> Response:
        cookie = request.cookies.get(COOKIE) or ""
        await self.form(request, Visitor(None, "anon", cookie, fresh=False))
        self.signer.sign_out(cookie)  # here, not only in this browser: a copy is refused too
        response = RedirectResponse("/ui/login", status_code=303)
        response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
        return response

    async def elsewhere(self, anything: str, request: Request) -> Response:
        return self.missing(self.signer.visitor(request), "page")


def dashboard_routes(signer: Signer) -> APIRouter:
    return Pages(signer).router()


_SECURITY_HEADERS = {
    # Nothing but this page's own inline styles; no script at all.
    "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    # Not no-referrer: with it a browser posts the forms with "Origin: null".
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


def _set_cookie(response: Response, value: str, max_age: int) -> None:
    response.set_cookie(
        COOKIE, value, max_age=max_age, httponly=True, samesite="strict", path="/ui"
    )


def _is_admin(visitor: Visitor) -> bool:
    return visitor.viewer is None


def _owner_query(visitor: Visitor, owner: str) -> str:
    """The query naming ``owner`` in the admin's links; none in anyone else's,
    whose only owner is their own."""
    return f"?owner={quote(owner, safe='')}" if _is_admin(visitor) else ""


def _back(session: str, query: str = "", anchor: str = "") -> Response:
    target = f"/ui/sessions/{quote(session, safe='')}{query}" + (f"#{anchor}" if anchor else "")
    return RedirectResponse(target, status_code=303)


def sign_in_redirect(exc: SignInRequired) -> Response:
    return RedirectResponse("/ui/login", status_code=303)
