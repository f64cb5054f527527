"""Who sees which conversations: the owner of a request and the viewer of the state routes.

Every compaction event and stored checkpoint records its **owner**: a keyed
digest of the upstream credential the client presented (``Authorization``,
``api-key`` or ``x-api-key``), never the credential itself. The state routes
answer with the caller's own only, so one key never reads another's summaries
or the messages they replaced:

* ``GET /v1/compaction/events`` — the caller's last N events, filtered in the
  store, so a busier neighbour never crowds them out of the limit;
* ``GET /v1/compaction/checkpoints/{id}`` — another owner's checkpoint is a
  404, the same answer as for one that does not exist.

A caller presenting ``server.admin_key`` in the ``x-compaction-proxy-admin-key``
header sees every owner's. ``server.api_key``, when set, guards these routes
like every other but ``/healthz`` (:class:`proxy.edge.guards.ProxyKeyGuard`), so the
admin sends both keys then.

A caller that presents **no credential of its own** is the anonymous owner
(the digest of ``""``), whether or not the proxy adds a configured fallback key
on the way upstream. Every keyless caller may spend that key, so they are one
principal: they see each other's keyless conversations and nothing of callers
who sent a key. (The fallback key could not name the owner anyway: it belongs
to a model's upstream, and the state routes name no model.) The same holds for
a client whose ``Authorization`` carried the proxy key: :class:`proxy.edge.guards.Edge`
takes every header holding the proxy's keys out before the owner is read, so
what is left is the client's own credential or none. Checkpoints and events
recorded before owners were have the owner ``""``, which only the admin sees.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import Final

from fastapi import Request
from pydantic import SecretStr

from proxy.edge.errors import Unauthorized
from proxy.edge.headers import ADMIN_KEY_HEADER, AUTH_HEADERS

#: Keys the owner digest: an owner read from the store or a response cannot be
#: checked against a guessed key with a plain hash, nor matched with the
#: checkpoint chain's own digests (proxy.session.conversation.scope_of).
_OWNER_KEY: Final = b"compaction-proxy/owner/v1"


def owner_digest(credential: str) -> str:
    """The owner of conversations made with ``credential`` (``""``: the anonymous one).

    ``Bearer`` is dropped, so a key sent as ``Authorization: Bearer k`` and as
    ``api-key: k`` is one owner; the model is not part of it, so an owner sees
    the conversations of every model it uses.
    """
    token = credential.strip()
    if token[:7].lower() == "bearer ":
        token = token[7:].strip()
    return hashlib.blake2b(token.encode(), key=_OWNER_KEY, digest_size=16).hexdigest()


def owner_of(headers: Iterable[tuple[str, str]]) -> str:
    """The owner of a request with these headers (see the module doc).

    The first of ``AUTH_HEADERS`` present is the credential, as upstream; the
    headers are the request's after the edge took the proxy's keys out.
    """
    presented: dict[str, str] = {}
    for name, value in headers:
        lower = name.lower()
        if lower in AUTH_HEADERS:
            presented[lower] = value  # the last one, as read_client_headers keeps it
    for name in AUTH_HEADERS:
        if name in presented:
            return owner_digest(presented[name])
    return owner_digest("")


def viewer(request: Request, admin_key: SecretStr | None) -> str | None:
    """The owner whose state ``request`` may read; ``None`` for the admin (everyone's).

    A wrong admin key, or one sent when none is configured, is refused rather
    than quietly shown the caller's own state as if it were everyone's.
    """
    presented = request.headers.get(ADMIN_KEY_HEADER)
    if presented is None:
        return owner_of(request.headers.items())
    expected = admin_key.get_secret_value().encode() if admin_key is not None else None
    if expected is None or not hmac.compare_digest(presented.encode(), expected):
        raise Unauthorized("A valid admin key is required.")
    return None
