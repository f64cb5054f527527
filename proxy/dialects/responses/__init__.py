"""OpenAI Responses (``POST /v1/responses``, Codex, the Agents SDK).

``dialect.py`` holds :data:`RESPONSES`; ``to_engine.py`` maps a request's
items to the engine's messages, ``from_engine.py`` maps them back;
``replies.py`` the ``/compact`` answer and the error event in this API's
shape; ``recall.py`` its side of recall (:mod:`proxy.dialects.recall`). The
rest of the proxy imports :data:`RESPONSES` from here.
"""

from proxy.dialects.responses.dialect import (
    CODEX_COMPACTION_PROMPT,
    RESPONSES,
    ResponsesDialect,
)

__all__ = ["CODEX_COMPACTION_PROMPT", "RESPONSES", "ResponsesDialect"]
