"""One request to a compacted endpoint, read: the :class:`Call` the handler works on.

Reading parses the body once (chat's own checks, or another API's mapping to
the engine through its :class:`~proxy.dialects.base.Dialect`), resolves the
model, builds the upstream headers with the right fallback key, and names
whose conversation it is (``scope``, for checkpoints; ``owner``, for who may
read its events). A large body does all of it in a worker thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request

from compaction import Conversation, Message, Prices
from config import ModelConfig, with_client_window
from proxy.dialects.base import Dialect, Mapped, Reading
from proxy.dialects.chat import CHAT
from proxy.edge.access import owner_digest
from proxy.edge.body import check_model, deep_nesting_refused, read_body
from proxy.flow import manual
from proxy.flow.continued import continued, remember_reading, without_commands
from proxy.flow.send import ClientHeaders, read_client_headers
from proxy.flow.services import Services
from proxy.session.conversation import Resolved, identify, scope_of
from proxy.session.naming import sent_session

#: Bodies larger than this are parsed, keyed and counted in a worker thread,
#: so one huge request never stalls the event loop (and every other request
#: on it). Smaller ones are parsed on the loop — a few milliseconds at most;
#: with the GIL a thread would only slice that work, at ~2 ms of hand-over
#: cost — and only their new text, if there is much, is tokenized in a
#: thread (see proxy.session.conversation.compact_if_needed).
OFF_LOOP_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class Call:
    """One request to a compacted endpoint, read: what the client asked, in the
    engine's terms and its own. Plain data — the services that serve it, the
    client's watch and what it spends are the handler's. A step that changes
    what it is (the model's config after a learned window, the messages
    without a ``/compact`` command) makes a new one."""

    raw: bytes
    body: dict[str, Any]
    messages: list[Message]
    config: ModelConfig
    headers: dict[str, str]
    #: Whose conversation, for which model: seeds its checkpoint chain.
    scope: bytes = b""
    #: Who may read its events and checkpoint (see proxy.edge.access.owner_of).
    owner: str = ""
    #: The messages keyed, counted and chained ahead (large bodies, off the loop).
    identified: Conversation | None = None
    #: The API the request speaks; for any but chat, ``body`` is the engine's
    #: view of it and ``original`` the client's request, ``mapped`` the mapping.
    dialect: Dialect = CHAT
    original: dict[str, Any] | None = None
    mapped: Mapped | None = None
    untouchable: str | None = None
    #: A ``/compact`` the user typed in its last turn (:mod:`proxy.flow.manual`),
    #: answered by the proxy instead of the model; ``None`` for most requests.
    command: manual.Command | None = None
    #: The session id its client sent, if any (see proxy.session.naming).
    client_session: str | None = None
    #: Its client's ``User-Agent``, for its figures.
    user_agent: str = ""
    #: The upstream its API goes to for its model (``Dialect.route``), found once.
    base_url: str = ""

    @property
    def streamed(self) -> bool:
        return (self.original or self.body).get("stream") is True

    def prices(self) -> Prices:
        """The prices of the request's upstream (the host its URL names), for its
        model and API: those of its answer, its summaries and the estimates."""
        return self.config.profile.prices(api=self.dialect.name, host=_host(self.base_url))

    def unchanged(self, resolved: Resolved) -> bool:
        """Whether the request goes upstream as the client sent it."""
        engine_messages = self.body["messages"] if self.mapped is None else self.mapped.messages
        return resolved.untouched and self.messages is engine_messages

    def outgoing(self, resolved: Resolved) -> dict[str, Any]:
        """The request to forward, in the client's API, with ``resolved``'s conversation."""
        mapped = self.mapped
        if mapped is None or self.original is None:
            return {**self.body, "messages": resolved.messages}
        return self.dialect.from_engine(self.original, mapped, resolved.messages)


@functools.lru_cache(maxsize=64)
def _host(url: str) -> str:
    """The host ``url`` names: the few upstream URLs of the configuration, split once."""
    return urlsplit(url).hostname or ""


def _parse(
    services: Services,
    raw: bytes,
    client: ClientHeaders,
    dialect: Dialect,
    owner: str,
    *,
    ahead: bool,
    reading: Reading | None = None,
    settled: int = 0,
) -> Call:
    """Parse, map to the engine, resolve the model, drop /compact exchanges; with
    ``ahead``, also key, count and chain the messages (what a large body does in
    a worker thread). ``reading`` is the body already read, if it was, its first
    ``settled`` messages known to hold no /compact exchange. The request's data
    goes from the dialect's :class:`Reading` straight into the one :class:`Call`."""
    reading = dialect.read(raw) if reading is None else reading
    body, original, mapped = reading.body, reading.original, reading.mapped
    untouchable, engine_messages = reading.untouchable, reading.messages
    check_model(body.get("model"), services.settings.server.max_model_chars)
    config = services.conversations.model_config(body.get("model"), owner)
    beta = client.forwarded.get("anthropic-beta")  # every one sent, as one list
    if beta is not None:  # most clients send none: no window of theirs to read
        config = with_client_window(config, beta)
    # Most bodies cannot hold the word: neither /compact exchanges to remove
    # nor a command to find (asked once, here).
    holds_command = manual.may_hold_command(raw)
    messages = without_commands(engine_messages, settled) if holds_command else engine_messages
    command = manual.find_command(messages) if holds_command else None
    base_url, key_env = dialect.route(config)
    fallback_key = services.upstream.configured_key(key_env)
    headers = client.upstream(fallback_key=fallback_key, fallback_header=dialect.key_header)
    # Whose conversation: the client's key, or the configured one it goes with.
    credential = (
        client.credential if client.credential is not None else headers.get(dialect.key_header)
    )
    scope = scope_of(config, credential, dialect.name)
    identified = None
    if ahead and untouchable is None:
        with deep_nesting_refused():
            identified = identify(services.conversations, config, body, messages, scope)
    return Call(
        raw=raw,
        body=body,
        messages=messages,
        config=config,
        identified=identified,
        headers=headers,
        scope=scope,
        owner=owner,
        dialect=dialect,
        original=original,
        mapped=mapped,
        untouchable=untouchable,
        command=command,
        client_session=sent_session(client.first),
        user_agent=client.first.get("user-agent", ""),
        base_url=base_url,
    )


async def read_call(request: Request, services: Services, dialect: Dialect = CHAT) -> Call:
    raw = await read_body(request, services.settings.server.max_body_bytes)
    client = read_client_headers(request.headers.items())
    owner = owner_digest(client.credential or "")  # as proxy.edge.access.owner_of reads it
    # A body too small to be worth the reading cache (most requests) is
    # neither looked up in it nor remembered: asked once, here.
    cached = services.conversations.readings.wants(raw)
    # A growing conversation's next request: only what it adds is read.
    continuation = continued(services.conversations, dialect, owner, raw) if cached else None
    if continuation is not None:
        read = _parse(
            services,
            raw,
            client,
            dialect,
            owner,
            ahead=False,
            reading=continuation.reading,
            settled=continuation.settled,
        )
    elif len(raw) > OFF_LOOP_BYTES:
        # Parsing, keying and counting megabytes takes long enough to stall
        # every other request on the loop: one worker thread does it all.
        read = await asyncio.to_thread(_parse, services, raw, client, dialect, owner, ahead=True)
    else:
        read = _parse(services, raw, client, dialect, owner, ahead=False)
    # The server is asked for its window off the request path (this request
    # is served on the window believed now).
    services.conversations.discover(read.config, read.base_url, read.headers)
    if not cached or read.original is not None or read.untouchable is not None:
        return read
    identified = await remember_reading(
        services.conversations,
        dialect,
        owner,
        raw,
        read.body,
        read.messages,
        config=read.config,
        scope=read.scope,
        identified=read.identified,
        previous=continuation.previous if continuation is not None else None,
    )
    if identified is read.identified:
        return read
    return dataclasses.replace(read, identified=identified)
