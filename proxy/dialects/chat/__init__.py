"""OpenAI Chat Completions (``POST /v1/chat/completions``), the engine's own format.

``dialect.py`` holds :data:`CHAT`, with the ``/compact`` answer and the error
event written in this API's shape (small enough to stay beside the mapping);
``recall.py`` is its side of recall (:mod:`proxy.dialects.recall`). The rest
of the proxy imports :data:`CHAT` from here.
"""

from proxy.dialects.chat.dialect import CHAT, ChatDialect

__all__ = ["CHAT", "ChatDialect"]
