"""The APIs the proxy compacts: each maps its requests to the engine's conversation.

``base.py`` holds the contract (:class:`~proxy.dialects.base.Dialect`) and the
mapping machinery every dialect shares; ``chat.py`` (Chat Completions, the
engine's own format), ``anthropic.py`` (``POST /v1/messages``, with the API's
pairing rule in ``anthropic_pairing.py``) and ``responses.py``
(``POST /v1/responses``, with the answers the proxy writes itself in
``responses_replies.py``) implement it.
"""
