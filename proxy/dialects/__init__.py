"""The APIs the proxy compacts: each maps its requests to the engine's conversation.

``base.py`` holds the contract (:class:`~proxy.dialects.base.Dialect`) and the
mapping machinery every dialect shares; ``chat.py`` (Chat Completions, the
engine's own format), ``anthropic.py`` (``POST /v1/messages``, with the API's
pairing rule in ``anthropic_pairing.py``) and ``responses.py``
(``POST /v1/responses``) implement it. Each also answers for what the proxy
writes in its API — the ``/compact`` reply, whole and streamed, and the error
event of a broken stream (``anthropic_replies.py``, ``responses_replies.py``;
chat's in ``chat.py``) — every event framed by ``sse.py``, the one SSE writer.
Nothing outside this package asks which API a request speaks (a test reads
the source for it): a fourth API is a new module here.
"""
