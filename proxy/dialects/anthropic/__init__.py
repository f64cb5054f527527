"""Anthropic Messages (``POST /v1/messages``, Claude Code).

``dialect.py`` holds :data:`ANTHROPIC`, the mapping to the engine and back;
``pairing.py`` the API's tool pairing rule (checked, and kept by a last pass);
``replies.py`` the ``/compact`` answer and the error event in this API's
shape; ``recall.py`` its side of recall (:mod:`proxy.dialects.recall`). The
rest of the proxy imports :data:`ANTHROPIC` from here.
"""

from proxy.dialects.anthropic.dialect import (
    ANTHROPIC,
    UNCUT,
    AnthropicDialect,
    pairing_problems,
)

__all__ = ["ANTHROPIC", "UNCUT", "AnthropicDialect", "pairing_problems"]
