"""The transport: one aiohttp session for every request the proxy sends upstream.

aiohttp is the client because it is the cheapest maintained one on the hot
path (CPU per small request on the bench machine, measured in one process
against a loopback upstream: aiohttp 0.17 ms, httpcore 0.41 ms, httpx
0.67 ms; docs/operations.md, *Talking to the upstream*). What this module adds to it is
configuration and one guard:

* Nothing is decompressed or added: no ``Accept-Encoding``, ``User-Agent``,
  ``Accept`` or ``Content-Type`` of aiohttp's own, no cookies kept between
  requests (each carries its own caller's credentials), no redirects
  followed. The upstream is asked for ``identity`` encoding, so the bytes
  relayed are the bytes received and error bodies can be read.
* Response heads are bounded: header lines of at most ``MAX_FIELD_BYTES``, at
  most ``MAX_HEADERS`` of them, and ``MAX_HEAD_BYTES`` in all.
* aiohttp retries idempotent methods on a kept-alive connection that closed
  under it; a POST is never sent twice. What it does not check is a pooled
  connection on which the upstream sent bytes while it was idle — an extra
  response, which the next request would read as its own (a desync that
  serves one caller's answer to another). :class:`_GuardedRequest` refuses
  such a connection before writing anything; the request then goes out once,
  on a fresh connection.
* Idle connections expire after ``keepalive_expiry`` seconds.
* With ``trust_env``, ``HTTP(S)_PROXY``/``NO_PROXY`` route requests (an https
  upstream through a CONNECT tunnel; credentials in the proxy URL), read once
  when the transport opens (:class:`_EnvProxies`). Certificates are checked
  against ``ca_bundle`` when set, else the system's trust store (OpenSSL
  honours ``SSL_CERT_FILE`` and ``SSL_CERT_DIR``).
"""

from __future__ import annotations

import functools
import ssl
import urllib.request
from collections.abc import AsyncIterator, Mapping

import aiohttp
import yarl

from proxy.upstream.transport.errors import (
    ConnectFailed,
    InvalidResponse,
    NoResponse,
    TransportError,
    TransportTimeout,
)
from proxy.upstream.transport.response import UpstreamResponse

MAX_FIELD_BYTES = 16 * 1024
MAX_HEADERS = 100
MAX_HEAD_BYTES = 64 * 1024
#: Headers aiohttp would add of its own accord; a relay adds none.
_NO_AUTO_HEADERS = ("Accept", "Accept-Encoding", "Content-Type", "User-Agent")


class _StaleConnection(Exception):
    """A pooled connection received bytes while no request was on it."""


class _GuardedRequest(aiohttp.ClientRequest):
    async def send(self, conn: aiohttp.connector.Connection) -> aiohttp.ClientResponse:
        protocol = conn.protocol
        # ``should_close`` holds once anything but a finished answer is on the
        # connection: buffered bytes, a parse error, a lost connection.
        if protocol is None or protocol.should_close:
            raise _StaleConnection
        return await super().send(conn)


class _EnvProxies:
    """``HTTP(S)_PROXY`` and ``NO_PROXY`` as they were when the transport opened.

    aiohttp's own ``trust_env`` reads them — and ``~/.netrc``, on a worker
    thread — on every request: 0.5 ms of CPU a request on the bench machine,
    and a netrc entry for the upstream would clash with the caller's own
    ``Authorization``. Here they are read once, and the answer for each
    upstream host is kept (a proxy has a handful).
    """

    def __init__(self) -> None:
        self._settings = urllib.request.getproxies_environment()
        self._chosen: dict[tuple[str, str], tuple[yarl.URL, dict[str, str]] | None] = {}

    def __bool__(self) -> bool:
        return any(scheme in self._settings for scheme in ("http", "https"))

    def for_url(self, url: yarl.URL) -> tuple[yarl.URL, dict[str, str]] | None:
        """The proxy for ``url`` and the headers for it (its credentials), or
        None to go direct."""
        key = (url.scheme, url.host or "")
        if key not in self._chosen:
            proxy = self._settings.get(url.scheme)
            # NO_PROXY from the settings read above (the function is in
            # urllib.request, though not in its type stubs).
            bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
            if proxy is None or bypass(key[1], self._settings):
                self._chosen[key] = None
            else:
                address = yarl.URL(proxy)
                credentials = aiohttp.BasicAuth.from_url(address)
                headers = {"Proxy-Authorization": credentials.encode()} if credentials else {}
                self._chosen[key] = (address.with_user(None), headers)
        return self._chosen[key]


@functools.lru_cache(maxsize=8)
def tls_context(ca_bundle: str | None) -> ssl.SSLContext:
    """Verification against ``ca_bundle``, or the system's trust store.

    Made once per bundle and shared by every transport of the process (the
    upstream's and the background summaries' pools): reading a trust store
    costs tens of milliseconds of CPU, and a context serves any number of
    connections. A bundle changed on disk is read at the next start.
    """
    if ca_bundle:
        return ssl.create_default_context(cafile=ca_bundle)
    return ssl.create_default_context()


class Transport:
    """Keep-alive connections to the upstream(s); open it inside a running loop."""

    def __init__(
        self,
        *,
        connect_timeout: float,
        read_timeout: float,
        max_connections: int,
        keepalive_expiry: float,
        trust_env: bool = True,
        ca_bundle: str | None = None,
        pool_timeout: float | None = None,
    ) -> None:
        """``pool_timeout`` bounds waiting for a free connection and opening one
        together (``connect_timeout`` when unset); ``connect_timeout`` still
        bounds opening one."""
        connector = aiohttp.TCPConnector(
            limit=max_connections,
            limit_per_host=0,
            keepalive_timeout=keepalive_expiry,
            ssl=tls_context(ca_bundle),
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(
                total=None,
                connect=pool_timeout if pool_timeout is not None else connect_timeout,
                sock_connect=connect_timeout,
                sock_read=read_timeout,
            ),
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            skip_auto_headers=_NO_AUTO_HEADERS,
            trust_env=False,  # read once instead: _EnvProxies
            request_class=_GuardedRequest,
            max_field_size=MAX_FIELD_BYTES,
            max_headers=MAX_HEADERS,
        )
        proxies = _EnvProxies() if trust_env else None
        # Asked once: most environments name no proxy, and then no request asks.
        self._proxies = proxies if proxies else None

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | AsyncIterator[bytes] | None,
    ) -> UpstreamResponse:
        """Send a request and return once the response head is in, its body unread.

        ``body`` is bytes (sent with a length) or an async iterator (sent
        chunked as it is read). Raises a :class:`TransportError`; ``ValueError``
        for a request that cannot be written (a line break in a header).
        """
        outgoing = {**headers, "accept-encoding": "identity"}
        # As given: the caller encoded the path, and it goes out byte for byte.
        target = yarl.URL(url, encoded=True)
        via = self._proxies.for_url(target) if self._proxies is not None else None
        proxy, proxy_headers = via if via is not None else (None, None)
        for attempt in (1, 2):
            try:
                response = await self._session.request(
                    method,
                    target,
                    headers=outgoing,
                    data=body,
                    allow_redirects=False,
                    proxy=proxy,
                    proxy_headers=proxy_headers,
                )
            except _StaleConnection:
                if attempt == 2:
                    raise NoResponse("the upstream sent bytes before any request") from None
                continue
            except aiohttp.ClientError as exc:
                raise _translated(exc) from exc
            except TimeoutError as exc:
                raise TransportTimeout("the upstream did not answer in time", phase="read") from exc
            break
        upstream = UpstreamResponse(response)
        if upstream.head_bytes > MAX_HEAD_BYTES:
            upstream.abort()
            raise InvalidResponse("the upstream's response headers are too large")
        return upstream

    async def aclose(self) -> None:
        await self._session.close()


def _translated(exc: aiohttp.ClientError) -> TransportError:
    """aiohttp's exception as the transport's own (the order matters: subclasses first)."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return TransportTimeout(
            "no upstream connection could be opened or became free in time", phase="connect"
        )
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return TransportTimeout("the upstream did not answer in time", phase="read")
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        return ConnectFailed("the upstream's TLS certificate or handshake was refused")
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ClientProxyConnectionError):
        return ConnectFailed("no connection could be opened")
    if isinstance(exc, aiohttp.ClientHttpProxyError):
        return ConnectFailed("the HTTP proxy refused the tunnel to the upstream")
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError):
        return NoResponse("the upstream closed the connection without an answer")
    if isinstance(exc, aiohttp.ClientResponseError):
        return InvalidResponse("the upstream's response is not valid HTTP/1.1")
    if isinstance(exc, aiohttp.InvalidURL):
        return ConnectFailed("its URL is not valid")
    return NoResponse("the upstream answered nothing usable")
