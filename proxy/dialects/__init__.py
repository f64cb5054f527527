"""The APIs the proxy compacts: each maps its requests to the engine's conversation.

``base.py`` holds the contract (:class:`~proxy.dialects.base.Dialect`) and the
mapping machinery every dialect shares; ``anthropic.py`` (``POST /v1/messages``)
and ``responses.py`` (``POST /v1/responses``) implement it.
"""
