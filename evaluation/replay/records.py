"""What each simulated upstream call cost: the record, its price, and the recorder
that fills both from the cache simulator.

One :class:`Recorder` per strategy run holds one :class:`~evaluation.replay.cache.PromptCache`;
the loopback upstream (for the proxy) and the in-process baselines call it the
same way, so every strategy is priced by the same rules::

    chat call     prompt read against the session's cache; ``broke`` when it
                  read less than the previous chat call of the session sent
                  (the new prompt does not extend the previous one)
    summary call  the same cache (an identical summary prompt asked again reads
                  it whole); ``repeat`` when the session asked it before;
                  ``used`` once its reply is found in a later chat prompt of
                  the session (:meth:`Recorder.chat` looks for it)
    cost          cached × cache_read + written × cache_write + output × output
                  (:meth:`compaction.pricing.Prices.cost`; every prompt token not
                  read from the cache is written to it)
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from compaction import Prices
from evaluation.replay.cache import PromptCache

CallKind = Literal["chat", "summary"]
#: What a summary call was for: a span's summary or a turn prefix's note, asked
#: while the session's request waited (``request``) or between requests
#: (``background``: a compaction prepared ahead of need).
SummaryKind = Literal["main", "turn-prefix"]


@dataclass(frozen=True)
class FactScore:
    """Next-step facts at one cut point (:mod:`evaluation.replay.facts`)."""

    total: int  #: facts the next turns need from the compactable past
    kept: int  #: of those, present verbatim in what the model was sent
    reachable: int  #: of the rest, in an original whose ``[ref: …]`` was sent


@dataclass(frozen=True)
class Call:
    """One upstream call as the simulated provider billed it."""

    session: str
    kind: CallKind
    turn: int  #: the cut point (index of the answer in the session); -1 for a summary
    step: int  #: which cut point of the session (0, 1, …); -1 for a summary
    time: float  #: virtual seconds since the session began
    tokens: int  #: prompt tokens
    cached: int  #: of those, read from the cache
    output: int  #: completion tokens
    broke: bool = False  #: a chat call that did not extend the previous one
    repeat: bool = False  #: a summary prompt the session had asked before
    stage: str = ""  #: the proxy's ``x-compaction-stage`` (chat calls through it)
    facts: FactScore | None = None
    summary_kind: SummaryKind | None = None  #: a summary call's purpose
    background: bool = False  #: a summary call asked between the session's requests
    #: A summary call whose reply a later chat prompt of the session carried.
    used: bool = False

    @property
    def written(self) -> int:
        return self.tokens - self.cached

    def cost(self, prices: Prices) -> float:
        """The call's price, in plain input tokens."""
        return prices.cost(
            uncached=0, cache_read=self.cached, cache_write=self.written, output=self.output
        )


class Recorder:
    """Prices calls against one cache and keeps them, in arrival order."""

    def __init__(self, cache: PromptCache) -> None:
        self.cache = cache
        self.calls: list[Call] = []
        self._previous: dict[str, int] = {}
        self._asked: dict[str, set[bytes]] = {}
        #: Per session: the replies of its summary calls not yet seen in a
        #: prompt, by the call's index in :attr:`calls`.
        self._pending: dict[str, dict[int, str]] = {}

    def chat(
        self,
        session: str,
        turn: int,
        step: int,
        time: float,
        segments: Sequence[str],
        output: int,
        *,
        stage: str = "",
        facts: FactScore | None = None,
        text: str = "",
    ) -> Call:
        """A chat call; ``text`` is what its prompt says (its messages' text), in
        which the session's summaries not yet used are looked for."""
        self._mark_used(session, text)
        read = self.cache.read(session, segments, time)
        previous = self._previous.get(session)
        self._previous[session] = read.tokens
        broke = previous is not None and read.cached < previous
        call = Call(
            session,
            "chat",
            turn,
            step,
            time,
            read.tokens,
            read.cached,
            output,
            broke,
            stage=stage,
            facts=facts,
        )
        self.calls.append(call)
        return call

    def summary(
        self,
        session: str,
        time: float,
        segments: Sequence[str],
        output: int,
        *,
        reply: str = "",
        kind: SummaryKind = "main",
        background: bool = False,
    ) -> Call:
        """A summary call that answered ``reply``, looked for in the session's
        later chat prompts: found, the call is ``used``. Without a reply it is
        not looked for and counts as used (a baseline's summary, which its
        next prompt carries by construction)."""
        read = self.cache.read(session, segments, time)
        digest = hashlib.blake2b("\x00".join(segments).encode(), digest_size=16).digest()
        asked = self._asked.setdefault(session, set())
        repeat = digest in asked
        asked.add(digest)
        call = Call(
            session,
            "summary",
            -1,
            -1,
            time,
            read.tokens,
            read.cached,
            output,
            repeat=repeat,
            summary_kind=kind,
            background=background,
            used=not reply.strip(),
        )
        if reply.strip():
            self._pending.setdefault(session, {})[len(self.calls)] = reply.strip()
        self.calls.append(call)
        return call

    def unused(self, session: str) -> bool:
        """Whether a summary of ``session`` is still to be found in a prompt."""
        return bool(self._pending.get(session))

    def _mark_used(self, session: str, text: str) -> None:
        """The session's summaries whose reply ``text`` carries are used. A reply is
        looked for whole: the proxy puts a summary's body into the prompt as the
        model wrote it (its checks accept or refuse a reply, never edit it), so a
        reply not found was refused, superseded, or never applied."""
        pending = self._pending.get(session)
        if not pending or not text:
            return
        for index, reply in list(pending.items()):
            if reply in text:
                self.calls[index] = dataclasses.replace(self.calls[index], used=True)
                del pending[index]
