"""The APIs the proxy compacts: each maps its requests to the engine's conversation.

One folder per API, the shared contract beside them:

- ``base.py``: the contract (:class:`~proxy.dialects.base.Dialect`, what a
  request reads as, :class:`~proxy.dialects.base.Reading`) and the mapping
  machinery every dialect shares;
- ``recall.py``: the recall contract, what each API answers for the tool the
  proxy adds; ``sse.py``: the one SSE splitter and writer, framing every event;
  ``shapes.py``: which API a body read from a file is written for (no route
  says it there);
- ``chat/`` (Chat Completions, the engine's own format), ``anthropic/``
  (``POST /v1/messages``) and ``responses/`` (``POST /v1/responses``): each
  holds its dialect in ``dialect.py`` and its side of recall in
  ``recall.py``; Anthropic's pairing rule is in ``anthropic/pairing.py``.

Each API also answers for what the proxy writes in it — the ``/compact``
reply, whole and streamed, and the error event of a broken stream
(``anthropic/replies.py``, ``responses/replies.py``; chat's in
``chat/dialect.py``). The rest of the proxy imports a dialect from its folder
(``from proxy.dialects.chat import CHAT``) and the contract from ``base.py``.
Nothing outside this package asks which API a request speaks (a test reads
the source for it): a fourth API is a new folder here.
"""
