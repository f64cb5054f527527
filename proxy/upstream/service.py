"""The upstream service: every way the proxy reaches the model's servers, in one place.

Like httpx's ``Client``, one object owns the connection pools and what is
known of each server's traffic; the request path, the summarizer and window
discovery all go through it:

* ``transport`` — the pool of the users' requests (``upstream.max_connections``);
* ``summaries_transport`` — the background preparations' own pool, so a
  summary never holds a connection a request waits for;
* ``traffic`` — what each upstream serves now (:mod:`proxy.upstream.traffic`);
* ``paces`` — how fast each upstream writes summaries (:mod:`proxy.upstream.pace`);
* ``discoveries`` — the questions about a server's window, off the request path
  (:mod:`proxy.upstream.discovery`).

Keys are :func:`proxy.state.models.calibration_key` (upstream and model), which
the caller computes: this layer knows servers, not what was learned of them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping

from config import ModelConfig, Settings
from proxy.edge.headers import AUTH_HEADERS
from proxy.upstream.discovery import Discoveries, ServerFacts, discover, is_local
from proxy.upstream.pace import Paces
from proxy.upstream.traffic import Traffic
from proxy.upstream.transport import Transport

logger = logging.getLogger(__name__)

#: What a window discovery does with what a server stated: keeps it; whether
#: the server stated a window.
Stated = Callable[[ModelConfig, ServerFacts], Awaitable[bool]]


class Upstream:
    """The pools, the traffic and the servers' paces (see the module doc).

    A ``transport`` given (a test's recording one) is not closed here, and
    serves the summaries too, so it records them with the rest.
    """

    def __init__(
        self, settings: Settings, *, transport: Transport | None = None, max_keys: int = 1024
    ) -> None:
        self.settings = settings.upstream
        self._owned = transport is None
        #: Every request upstream: relayed ones and the llm summarizer's.
        self.transport = transport or build_transport(settings)
        #: The pool the preparations' summaries are asked through (``None``:
        #: through ``transport``, a test's).
        self.summaries_transport = (
            build_transport(settings, background=True) if self._owned else None
        )
        self.traffic = Traffic()
        self.paces = Paces()
        self.discoveries = Discoveries(max_keys=max_keys)
        #: Each configured key variable's value, read once (the names are the settings').
        self._keys: dict[str, str | None] = {}

    @property
    def background_pool(self) -> Transport:
        """The pool a summary asked off the request path goes through."""
        return self.summaries_transport or self.transport

    def configured_key(self, env: str | None) -> str | None:
        """The key in the variable ``env`` (a model's ``api_key_env`` or
        ``anthropic_api_key_env``), used only when a client sends none.

        Read from the environment the first time it is asked for, then kept:
        a process's environment is set before it starts, and reading it
        (encoding the name, decoding the value) was a cost of every request."""
        if not env:
            return None
        keys = self._keys
        if env not in keys:
            keys[env] = os.environ.get(env) or None
        return keys[env]

    def discover(
        self,
        key: str,
        config: ModelConfig,
        base: str,
        headers: Mapping[str, str],
        stated: Stated,
    ) -> None:
        """Ask the upstream, in the background, which window it serves this model
        with, unless it was asked already (:class:`Discoveries`); never waits.

        Only for a request going to ``config.upstream`` (``base``), whose
        credentials (in ``headers``, the request's upstream headers) are then
        for that server, and only as
        ``upstream.discover_windows`` allows; what it states goes to ``stated``.
        """
        mode = self.settings.discover_windows
        if base != config.upstream or mode == "never":
            return
        if mode == "auto" and not is_local(config.upstream):
            return
        self.discoveries.start(key, self._ask, config, headers, stated)

    async def _ask(self, config: ModelConfig, headers: Mapping[str, str], stated: Stated) -> bool:
        # Picked out only when the server is asked: once per model, not per request.
        credentials = {name: headers[name] for name in AUTH_HEADERS if name in headers}
        facts = await discover(
            self.background_pool,
            config.upstream,
            config.model,
            credentials,
            timeout=self.settings.discovery_timeout_seconds,
        )
        if facts is None:
            logger.info("the upstream states no context window for %r", config.model)
            return False
        return await stated(config, facts)

    async def aclose(self) -> None:
        """Stop the discoveries and close the pools this service opened."""
        await self.discoveries.close()
        if self._owned:
            await self.transport.aclose()
        if self.summaries_transport is not None:
            await self.summaries_transport.aclose()


def build_transport(settings: Settings, *, background: bool = False) -> Transport:
    """The pool of the requests (``upstream.max_connections``), or with
    ``background`` the preparations' own (``background.max_connections``), whose
    summaries wait their turn for a connection up to their deadline: nobody is
    waiting on the other side."""
    upstream = settings.upstream
    if not background and "max_keepalive_connections" in upstream.model_fields_set:
        logger.warning(
            "upstream.max_keepalive_connections is ignored: idle connections "
            "expire after upstream.keepalive_expiry (%.1f s)",
            upstream.keepalive_expiry,
        )
    return Transport(
        connect_timeout=upstream.connect_timeout,
        read_timeout=upstream.read_timeout,
        max_connections=(
            settings.background.max_connections if background else upstream.max_connections
        ),
        keepalive_expiry=upstream.keepalive_expiry,
        trust_env=upstream.trust_env,
        ca_bundle=str(upstream.ca_bundle) if upstream.ca_bundle else None,
        pool_timeout=upstream.summarizer_timeout_seconds if background else None,
    )
