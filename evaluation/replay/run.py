"""The replay driver: every strategy over every session, at every window.

For each window::

    baselines   in-process (:mod:`evaluation.replay.baselines`), one cache
                simulator per strategy and cache lifetime
    proxy       for each price preset and summarizer: a loopback upstream
                (:mod:`evaluation.replay.upstream`) with its own simulator, a
                real ``compaction-proxy serve`` in front of it
                (:mod:`evaluation.replay.serve`), and the replay client
                (:mod:`evaluation.replay.client`) sending up to ``concurrency``
                sessions at once, each with its own key

Each strategy run yields a :class:`Run`: its calls as the simulator billed
them (prices are applied by the report, so a baseline run serves every price
preset of the same cache lifetime). The next-step facts of each session are
computed once (:class:`~evaluation.replay.facts.SessionFacts`) and scored for
every strategy the same way. Every proxy and upstream is stopped in
``finally``; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import aiohttp

from compaction import PRICING_PRESETS, Message
from compaction.budget.pricing import PRESETS, Prices
from evaluation.replay.baselines import BASELINES, Context, input_limit
from evaluation.replay.cache import PromptCache, SegmentTokens
from evaluation.replay.client import replay_session, session_key
from evaluation.replay.facts import SessionFacts
from evaluation.replay.prompts import message_segment, prompt_segments
from evaluation.replay.records import Call, Recorder
from evaluation.replay.serve import ProxyConfig, RunningProxy, metric_values, serving
from evaluation.replay.sessions import REPLAY_MODEL, Session
from evaluation.replay.upstream import LoopbackUpstream, Script

DEFAULT_WINDOWS: Final = (8_192, 16_384, 32_768)
DEFAULT_PRICES: Final = ("anthropic", "openai")
SUMMARIZERS: Final = ("extractive", "llm", "llm-always")
DEFAULT_GAP: Final = 30.0
#: Sessions in flight at once through one proxy. One keeps a run reproducible: the
#: proxy learns one calibration ratio per model from every session's answers, so
#: sessions run side by side see it in an order that differs between runs.
DEFAULT_CONCURRENCY: Final = 1
#: Seconds the client waits, after an answer, for the proxy's background preparations.
SETTLE_SECONDS: Final = 30.0
_SETTLE_POLL: Final = 0.02


@dataclass(frozen=True)
class Options:
    windows: tuple[int, ...] = DEFAULT_WINDOWS
    prices: tuple[str, ...] = DEFAULT_PRICES
    summarizers: tuple[str, ...] = SUMMARIZERS
    baselines: tuple[str, ...] = tuple(BASELINES)
    gap: float = DEFAULT_GAP
    concurrency: int = DEFAULT_CONCURRENCY
    workdir: Path | None = None  #: where the proxies keep their store and log


@dataclass(frozen=True)
class Run:
    """One strategy at one window: every call it made, as billed."""

    window: int
    strategy: str  #: "proxy (extractive)", "proxy (llm)", or a baseline's name
    #: The preset the proxy ran with; ``None`` for a baseline (priced by any preset
    #: of the same cache lifetime).
    prices: str | None
    lifetime: float
    calls: tuple[Call, ...]
    failures: tuple[str, ...] = ()
    summary_fallbacks: int = 0
    refused: int = 0
    skipped: int = 0  #: sessions left out: their head alone is above the input limit
    seconds: float = 0.0


def prices_of(name: str) -> Prices:
    if name not in PRESETS or name not in PRICING_PRESETS:
        raise ValueError(f"unknown price preset {name!r}; one of {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


def recall_salt_for(key: str) -> str:
    """The salt the proxy writes this replay key's refs with (its own functions)."""
    from config import Settings, resolve_model
    from proxy.session.conversation import recall_salt, scope_of

    config = resolve_model(Settings(), REPLAY_MODEL)
    return recall_salt(scope_of(config, f"Bearer {key}", "chat"))


async def replay(
    sessions: Sequence[Session],
    options: Options,
    tokens: SegmentTokens,
    progress: Callable[[str], None] | None = None,
) -> list[Run]:
    """Every strategy of ``options`` over ``sessions``; the runs in a stable order.

    At each window, a session whose head (with the tool schemas) alone is above
    the input limit is left out of every strategy: the proxy refuses it, and a
    refused request would cost nothing.
    """
    every_facts = [SessionFacts(s.messages, s.head) for s in sessions]
    runs: list[Run] = []
    say = progress or (lambda _: None)
    lifetimes = sorted({prices_of(name).cache_lifetime for name in options.prices})
    with tempfile.TemporaryDirectory(prefix="replay-", dir=options.workdir) as scratch:
        for window in options.windows:
            fitting = [i for i, s in enumerate(sessions) if head_fits(s, window, tokens)]
            here = [sessions[i] for i in fitting]
            facts = [every_facts[i] for i in fitting]
            skipped = len(sessions) - len(here)
            for lifetime in lifetimes:
                for name in options.baselines:
                    started = time.perf_counter()
                    calls = await baseline_calls(
                        here, facts, name, window, lifetime, options.gap, tokens
                    )
                    seconds = time.perf_counter() - started
                    runs.append(
                        Run(window, name, None, lifetime, calls, skipped=skipped, seconds=seconds)
                    )
                    say(f"{window:>7} {name:<22} {'':<10} {seconds:6.1f} s")
            for price in options.prices:
                for summarizer in options.summarizers:
                    config = ProxyConfig(window, price, summarizer)
                    folder = Path(scratch) / f"{window}-{price}-{summarizer}"
                    started = time.perf_counter()
                    run = await proxy_run(here, facts, config, options, tokens, folder)
                    seconds = time.perf_counter() - started
                    runs.append(dataclasses.replace(run, skipped=skipped, seconds=seconds))
                    say(f"{window:>7} {run.strategy:<22} {price:<10} {seconds:6.1f} s")
    return runs


def head_fits(session: Session, window: int, tokens: SegmentTokens) -> bool:
    """Whether ``session``'s head and tools fit the input limit of ``window``."""
    context = Context(window, session.head, session.tools, tokens.count)
    return context.tokens(session.messages[: session.head]) <= input_limit(window)


async def baseline_calls(
    sessions: Sequence[Session],
    facts: Sequence[SessionFacts],
    name: str,
    window: int,
    lifetime: float,
    gap: float,
    tokens: SegmentTokens,
) -> tuple[Call, ...]:
    """The calls baseline ``name`` makes over ``sessions`` at ``window``."""
    recorder = Recorder(PromptCache(tokens, lifetime))
    for session, session_facts in zip(sessions, facts, strict=True):
        context = Context(window, session.head, session.tools, tokens.count)
        strategy = BASELINES[name](context)
        previous: list[Message] = []
        previous_k = session.head
        for step, k in enumerate(session.cuts):
            history = session.messages[:k]
            sent = await strategy.send(history)
            at = step * gap
            if sent.summary_prompt is not None:
                body = {"tools": session.tools, "messages": sent.summary_prompt}
                recorder.summary(session.name, at, prompt_segments(body), sent.summary_output)
            appended = previous + history[previous_k:k]
            rewritten = step > 0 and sent.messages != appended
            output = tokens.count(message_segment(session.messages[k]))
            body = {"tools": session.tools, "messages": sent.messages}
            recorder.chat(
                session.name,
                k,
                step,
                at,
                prompt_segments(body),
                output,
                stage="rewritten" if rewritten or sent.compacted else "none",
                facts=session_facts.score(k, sent.messages),
            )
            previous, previous_k = sent.messages, k
    return tuple(recorder.calls)


async def proxy_run(
    sessions: Sequence[Session],
    facts: Sequence[SessionFacts],
    config: ProxyConfig,
    options: Options,
    tokens: SegmentTokens,
    folder: Path,
) -> Run:
    """``sessions`` through a real proxy started with ``config``."""
    lifetime = prices_of(config.prices).cache_lifetime
    upstream = LoopbackUpstream(Recorder(PromptCache(tokens, lifetime)), tokens)
    keys = [session_key(i) for i in range(len(sessions))]
    for key, session, session_facts in zip(keys, sessions, facts, strict=True):
        scorer = functools.partial(
            session_facts.score, refs=session_facts.refs(recall_salt_for(key))
        )
        upstream.register(key, Script(session.name, session.messages, scorer))
    stages: dict[tuple[str, int], str] = {}
    failures: list[str] = []
    fallbacks = 0
    base_url = await upstream.start()
    try:
        async with serving(config, base_url, folder) as proxy, aiohttp.ClientSession() as client:
            settle = _settler(client, proxy, upstream) if config.asks_a_model else None
            gate = asyncio.Semaphore(max(1, options.concurrency))

            async def one(session: Session, key: str) -> None:
                async with gate:
                    replayed = await replay_session(
                        client,
                        proxy.base_url,
                        session,
                        key,
                        options.gap,
                        settle,
                        functools.partial(upstream.expect, session.name),
                    )
                stages.update({(session.name, k): s for k, s in replayed.stages.items()})
                failures.extend(f"{session.name} {line}" for line in replayed.failures)

            await asyncio.gather(*(one(s, k) for s, k in zip(sessions, keys, strict=True)))
            if settle is not None:
                await settle()
            _, fallbacks = await metric_values(client, proxy)
    finally:
        await upstream.close()
    calls = tuple(
        dataclasses.replace(call, stage=stages.get((call.session, call.turn), ""))
        if call.kind == "chat"
        else call
        for call in upstream.recorder.calls
    )
    name = f"proxy ({config.summarizer})"
    return Run(
        config.window,
        name,
        config.prices,
        lifetime,
        calls,
        tuple(failures),
        fallbacks,
        upstream.refused,
    )


def _settler(
    client: aiohttp.ClientSession, proxy: RunningProxy, upstream: LoopbackUpstream
) -> Callable[[], Awaitable[None]]:
    async def settle() -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_SECONDS
        while loop.time() < deadline:
            running, _ = await metric_values(client, proxy)
            if running == 0 and upstream.summaries_in_flight == 0:
                return
            await asyncio.sleep(_SETTLE_POLL)

    return settle
