"""The dialect contract: an API's request ↔ the engine's chat-format conversation.

The engine (``compaction``) works on OpenAI Chat Completions messages: a
system head, user/assistant turns, tool groups (an assistant message with
``tool_calls`` and the ``tool`` messages answering them). A **dialect** maps
one API's request onto such messages and maps the engine's output back:

    request ──to_engine──▶ Mapped(messages, request, items) ──engine──▶ messages'
    messages' ──from_engine──▶ the request to forward

Every engine message a dialect makes carries :data:`ORIGIN` — the id of the
request item it came from and its part — so that the way back knows, for each
output message, what it stands for. The key survives the engine's copies
(a pruned tool result is ``{**message, "content": brief}``) and the store (a
checkpoint's replacement messages are JSON), and it is never sent anywhere:
no dialect forwards engine messages as they are.

:func:`rebuild` does the way back for every dialect. It walks the output in
order and gathers the messages of each origin item: an item all of whose parts
come back unchanged (the same objects, or equal copies from a stored
checkpoint) is forwarded **as it was**, so its bytes are the client's; an item
some of whose parts were changed (a pruned tool output) is rebuilt by the
dialect from the original and the changed parts; messages with no origin (the
summary) become new items. An item none of whose parts come back was condensed
away.

Origin ids are content hashes of the item (:func:`item_id`), not positions:
a checkpoint made on one request is applied to the next, where the same item
may sit elsewhere. The n-th of several identical items is told apart by ``'``
appended n-1 times to the hashed bytes, so it gets the same id on every request
that holds as many before it; :class:`Mapped` carries each repeated content's
hash state along, so a body of many twins costs one hash per item, not one per
twin before it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from compaction import ORIGIN_KEY, Message
from config import ModelConfig
from proxy.dialects.recall import RecallSurface
from proxy.edge.body import parse_object

#: Key on an engine message: ``"<item id>:<part>"`` of the request item it stands
#: for (the engine leaves it out of its counts).
ORIGIN = ORIGIN_KEY


def item_id(item: Any, salt: str = "") -> str:
    """A stable id for a request item: its content's hash (``salt`` tells twins apart)."""
    return _content_hash(item, salt).hexdigest()


def _content_hash(item: Any, salt: str) -> hashlib.blake2b:
    digest = hashlib.blake2b(orjson.dumps(item), digest_size=12)
    digest.update(salt.encode())
    return digest


def tag(message: Message, origin: str, part: int = 0) -> Message:
    """``message`` marked as part ``part`` of the item ``origin``."""
    message[ORIGIN] = f"{origin}:{part}"
    return message


def origin_of(message: Message) -> tuple[str, int] | None:
    value = message.get(ORIGIN)
    if not isinstance(value, str) or ":" not in value:
        return None
    origin, _, part = value.rpartition(":")
    return origin, int(part)


@dataclass
class Mapped:
    """A request as the engine sees it."""

    #: Chat-format messages, head first, each tagged with :data:`ORIGIN`.
    messages: list[Message]
    #: The engine's view of the request: ``model``, ``messages``, ``tools`` and
    #: the output asked for (``max_tokens``), for counting and budgets.
    request: dict[str, Any]
    #: Origin id → the request item it names (what :func:`rebuild` forwards or rebuilds).
    items: dict[str, Any] = field(default_factory=dict)
    #: Origin id → the engine messages made from it, in order (to tell unchanged parts).
    parts: dict[str, list[Message]] = field(default_factory=dict)
    #: The id of a content's first item → the hash of its last twin's bytes, to go on from.
    _twins: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: ``id()`` of an item added once, and its salt → its origin id, so adding it
    #: again changes nothing.
    _added: dict[tuple[int, str], str] = field(default_factory=dict, repr=False, compare=False)

    def add(self, item: Any, messages: Sequence[Message], salt: str = "") -> None:
        """Record ``item`` and the engine messages it maps to, tagging them."""
        origin = self._added.get((id(item), salt))
        if origin is None:
            origin = self._origin(item, salt)
            self._added[id(item), salt] = origin
        self.items[origin] = item
        self.parts[origin] = list(messages)
        for part, message in enumerate(messages):
            tag(message, origin, part)
        self.messages.extend(messages)

    def _origin(self, item: Any, salt: str) -> str:
        """The first id, of content plus ``salt`` plus ``'`` repeated, that no item holds."""
        digest = _content_hash(item, salt)
        first = digest.hexdigest()
        if first not in self.items:
            return first
        # The same content again: each ``'`` extends the last twin's hash by
        # one byte, where hashing the item anew for every twin before it would
        # make n twins cost n² item hashes.
        digest = self._twins.get(first, digest)
        origin = first
        while origin in self.items:
            digest.update(b"'")
            origin = digest.hexdigest()
        self._twins[first] = digest
        return origin


#: Builds a request item from the original item and the engine messages that
#: came back for it (some changed, some maybe missing); ``None`` drops it.
Rebuild = Callable[[Any, list[Message]], Any]
#: Builds new request items from engine messages with no origin (the summary).
Create = Callable[[list[Message]], list[Any]]


def rebuild(
    mapped: Mapped,
    messages: Sequence[Message],
    *,
    changed: Rebuild,
    created: Create,
    skip: Callable[[str], bool] = lambda origin: False,
) -> list[Any]:
    """The request items for the engine's output ``messages`` (see the module doc).

    ``skip`` leaves out origins that are not list items (a top-level system).
    """
    out: list[Any] = []
    for origin, group in _runs(messages):
        if origin is None:
            out.extend(created(group))
            continue
        if skip(origin):
            continue
        item = mapped.items.get(origin)
        if item is None:  # a message from a checkpoint whose item is gone: keep its text
            out.extend(created([{k: v for k, v in m.items() if k != ORIGIN} for m in group]))
            continue
        original = mapped.parts.get(origin, [])
        same = len(group) == len(original)  # and each the same object, or equal (a stored copy)
        if same and all(a is b or a == b for a, b in zip(group, original, strict=True)):
            out.append(item)
        else:
            built = changed(item, group)
            if built is not None:
                out.append(built)
    return out


def _runs(messages: Sequence[Message]) -> Iterator[tuple[str | None, list[Message]]]:
    """Consecutive messages grouped by origin item (``None``: no origin)."""
    current: str | None = None
    group: list[Message] = []
    for message in messages:
        found = origin_of(message)
        origin = found[0] if found else None
        if group and (origin != current or origin is None):
            yield current, group
            group = []
        current = origin
        group.append(message)
    if group:
        yield current, group


def clean(message: Message) -> Message:
    """``message`` without :data:`ORIGIN` (for a summarizer request)."""
    return {k: v for k, v in message.items() if k != ORIGIN}


class Dialect(Protocol):
    """One API the proxy compacts. Implementations are stateless singletons.

    Everything the request path does differently for an API is asked of its
    dialect — how its body is read, how its conversation maps to the engine
    and back, how its summary is asked and read, what the proxy answers in it
    (``/compact``, the error event of a broken stream) — so that the path
    itself never asks which API it serves, and a fourth API is one module.
    """

    #: ``"chat"``, ``"anthropic"`` or ``"responses"``: labels, logs, scopes.
    name: str
    #: The path under the upstream's base URL, e.g. ``"/messages"``.
    path: str
    #: The header a configured key goes in when the client sends none
    #: (``"authorization"``, as ``Bearer``; Anthropic's ``"x-api-key"``).
    key_header: str
    #: Whether the answer's ``usage`` counts cached prompt tokens apart from
    #: ``input_tokens`` (Anthropic), so that the prompt is their sum.
    cached_usage_apart: bool
    #: How the recall tool is declared and its calls answered in this API.
    recall: RecallSurface

    def route(self, config: ModelConfig) -> tuple[str, str | None]:
        """Where this API's requests for ``config``'s model go: the base URL, and
        the variable holding the key used when the client sends none."""
        ...

    def read(self, raw: bytes) -> Reading:
        """The request body ``raw`` parsed, checked and mapped to the engine (a 400,
        :class:`proxy.edge.errors.BadRequest`, for a body it cannot read)."""
        ...

    def check(self, body: dict[str, Any]) -> None:
        """Raise :class:`proxy.edge.errors.BadRequest` for a body this API would refuse
        in a way that stops the proxy from reading it (no conversation)."""
        ...

    def untouchable(self, body: dict[str, Any]) -> str | None:
        """Why this request must be forwarded byte for byte (server-side state, the
        client's own compaction), or ``None`` when it may be compacted."""
        ...

    def to_engine(self, body: dict[str, Any]) -> Mapped: ...

    def from_engine(
        self, body: dict[str, Any], mapped: Mapped, messages: list[Message]
    ) -> dict[str, Any]:
        """The request to forward: ``body`` with its conversation from ``messages``;
        every field the proxy does not own unchanged."""
        ...

    def summary_request(
        self, model: str, messages: list[Message], max_tokens: int
    ) -> dict[str, Any]:
        """A non-streamed request, in this API, asking ``model`` for the reply to the
        summarizer's chat-format ``messages`` (a system prompt, then user turns)."""
        ...

    def summary_retry(
        self, request: dict[str, Any], status: int, reply: bytes
    ) -> dict[str, Any] | None:
        """The request to send once more when the upstream refused the summary
        ``request`` with ``status`` and ``reply`` in a way this API's models are
        known to (parameters a model family wants named otherwise), else ``None``."""
        ...

    def summary_text(self, reply: Any) -> str:
        """The text of a reply to :meth:`summary_request`; raise
        :class:`compaction.SummarizationError` if it has none."""
        ...

    def summary_cut_off(self, reply: Any) -> bool:
        """Whether a reply to :meth:`summary_request` stopped at the output limit
        it was given, its text unfinished."""
        ...

    def manual_reply(self, model: str, text: str) -> dict[str, Any]:
        """A whole (non-streamed) answer in this API carrying ``text``: ``/compact``."""
        ...

    def manual_events(
        self, model: str, text: str, request: Mapping[str, Any] | None = None
    ) -> Iterator[bytes]:
        """The same answer as this API's stream of server-sent events, framed by
        :mod:`proxy.dialects.sse`; ``request`` is the client's, as sent, for the
        stream options it asked (``None``: none)."""
        ...

    def error_event(self, message: str, code: str) -> bytes:
        """The server-sent event that tells this API's clients why their stream
        stops (an upstream stream that broke or ended empty): ``message`` for
        people, ``code`` for programs."""
        ...


@dataclass(frozen=True)
class Reading:
    """A request body as its dialect read it: what the request path starts from."""

    #: The engine's view of the request: ``model``, ``messages``, ``tools`` and
    #: the output asked for (for chat, the request itself).
    body: dict[str, Any]
    #: The conversation the engine works on (none when ``untouchable``).
    messages: list[Message]
    #: Another API's request, as sent (``None`` for chat: ``body`` is it).
    original: dict[str, Any] | None = None
    #: How ``original`` maps onto ``messages`` (``None`` for chat: the identity).
    mapped: Mapped | None = None
    #: Why the request goes upstream byte for byte (another API's own state).
    untouchable: str | None = None


def read_mapped(dialect: Dialect, raw: bytes) -> Reading:
    """How an API other than the engine's own is read: parsed, checked, and mapped
    to the engine unless it must be forwarded untouched."""
    original = parse_object(raw)
    dialect.check(original)
    untouchable = dialect.untouchable(original)
    if untouchable is not None:
        return Reading(body=original, messages=[], original=original, untouchable=untouchable)
    mapped = dialect.to_engine(original)
    return Reading(body=mapped.request, messages=mapped.messages, original=original, mapped=mapped)
