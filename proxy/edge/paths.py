"""The upstream URL of a pass-through request, built from the path as the client sent it.

The router matches on the *decoded* path: to it ``/v1/%2e%2e/admin`` is
``/v1/../admin`` and ``/v1/a%2Fb`` is ``/v1/a/b``. Forwarding that decoded
path would let a client walk out of the upstream's base path and put a
space, a ``?`` or a NUL into the upstream request line. So the URL is built
from ASGI's ``raw_path`` instead:

    raw path   /v1/models/ft%3Aa%2Fb/        (the route prefix ``v1`` dropped)
    segments   models | ft%3Aa%2Fb | ""       each decoded only to be checked
    forwarded  {base_url}/models/ft%3Aa%2Fb/  in the client's own spelling

A segment keeps the client's spelling (``%3A`` and ``:`` are not the same
to every server), a byte that may not stand in a path segment is
percent-encoded, and an encoded ``/`` stays inside its segment. Refused with
400: a segment that decodes to ``.`` or ``..`` — or holds one between ``/``
or ``\\`` once decoded, for upstreams that decode ``%2F`` before resolving
dot segments —, an empty segment inside the path (``//``; a trailing slash
is kept), a malformed ``%`` escape, and a control character, space or DEL,
raw or decoded. So the result always starts with ``{base_url}/`` and never
resolves above it. The query string is forwarded as received, with the
same bytes refused and any byte that may not stand in a query encoded.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote_to_bytes

from proxy.edge.errors import BadRequest

#: Bytes that stand for themselves in a path segment (RFC 3986 ``pchar``),
#: plus ``%``, whose escapes are checked apart.
_SEGMENT_UNSAFE = re.compile(rb"[^A-Za-z0-9\-._~!$&'()*+,;=:@%]")
#: A query may hold ``/`` and ``?`` as well.
_QUERY_UNSAFE = re.compile(rb"[^A-Za-z0-9\-._~!$&'()*+,;=:@%/?]")
_MALFORMED_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")
#: Control characters, space and DEL: never sent on, raw or decoded.
_FORBIDDEN = re.compile(rb"[\x00-\x20\x7f]")
_DOT_PARTS = re.compile(rb"(?:\A|[/\\])\.\.?(?:\Z|[/\\])")


def _encode(raw: bytes, unsafe: re.Pattern[bytes]) -> str:
    return unsafe.sub(lambda match: b"%%%02X" % match[0][0], raw).decode("ascii")


def _segment(raw: bytes) -> str:
    if _MALFORMED_ESCAPE.search(raw):
        raise BadRequest("The request path has a malformed percent-escape.")
    decoded = unquote_to_bytes(raw)
    if _FORBIDDEN.search(decoded):
        raise BadRequest("The request path has a control character or a space.")
    if _DOT_PARTS.search(decoded):
        raise BadRequest("The request path has a '.' or '..' segment.")
    return _encode(raw, _SEGMENT_UNSAFE)


def forward_url(base_url: str, raw_path: bytes, query: bytes, *, prefix: str) -> str:
    """``base_url`` joined with ``raw_path`` less its first segment ``prefix``
    (the proxy's own route, e.g. ``v1``), and ``query``; or a 400."""
    segments = raw_path.split(b"/")
    if segments[0] != b"" or len(segments) < 3 or unquote_to_bytes(segments[1]) != prefix.encode():
        raise BadRequest(f"The request path must start with /{prefix}/.")
    rest = segments[2:]
    if b"" in rest[:-1]:
        raise BadRequest("The request path has an empty segment ('//').")
    url = base_url.rstrip("/") + "/" + "/".join(_segment(segment) for segment in rest)
    if query:
        if _FORBIDDEN.search(query):
            raise BadRequest("The query string has a control character or a space.")
        url += "?" + _encode(query, _QUERY_UNSAFE)
    return url


def raw_path_of(scope_path: str, raw_path: bytes | None) -> bytes:
    """The path as received; servers that do not report it get the decoded
    path re-encoded (an encoded ``/`` then counts as a separator)."""
    return raw_path if raw_path is not None else quote(scope_path).encode("ascii")
