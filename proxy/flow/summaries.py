"""The llm summarizer a request's compaction asks: in the request's own API,
with its own key, its calls counted and priced as the request's.

Built only for a request that goes the full way with the llm summarizer
(:meth:`proxy.flow.exchange.Exchange.compact_for`); what its calls cost is
read off it there once the compaction is over.
"""

from __future__ import annotations

import asyncio
import math

from compaction import Message
from proxy.flow.read import Call
from proxy.flow.services import Services
from proxy.upstream.summarizer import UpstreamSummarizer
from proxy.upstream.usage import Usage


def summarizer_for(services: Services, call: Call) -> UpstreamSummarizer:
    """The llm summarizer of ``call``'s compaction, asked upstream as ``call`` is."""
    headers = {k: v for k, v in call.headers.items() if k != "content-type"}
    config, model = call.config, call.config.model
    conversations, metrics = services.conversations, services.observed.metrics
    prices = call.prices()

    async def estimate(messages: list[Message], text: str) -> Usage:
        """A summary call whose answer reported no ``usage``: its prompt and
        reply counted here (the prompt in a worker thread), in the upstream's
        tokens, the prompt taken as uncached."""
        counter = conversations.counter(config)
        ratio = conversations.models.ratio(config, call.owner)
        sent = await asyncio.to_thread(counter.count_request, {"messages": messages})
        prompt, output = math.ceil(sent * ratio), math.ceil(counter.count_text(text) * ratio)
        return Usage(prompt=prompt, output=output)

    async def calibrate(messages: list[Message], prompt_tokens: int) -> None:
        """A summary's reply counted ``prompt_tokens`` for ``messages``: a
        calibration sample like any answer's, and the only one from servers
        that send no ``usage`` on streams (llama-cpp-python). A summary's
        prompt is new text, up to a window of it: counted in a worker thread
        (once a summary, against the seconds the summary took)."""
        counter = conversations.counter(config)
        estimate = await asyncio.to_thread(counter.count_request, {"messages": messages})
        conversations.models.observe(config, estimate, prompt_tokens, call.owner)

    return UpstreamSummarizer(
        services.upstream.transport,
        call.base_url,
        config.summary_model,
        headers,
        dialect=call.dialect,
        on_call=metrics.summarizer_calls.inc,
        deadline=services.settings.upstream.summarizer_timeout_seconds,
        # A summary by another model says nothing of how this one counts.
        on_usage=calibrate if config.summary_model == model else None,
        prices=prices,
        on_spent=lambda usage, cost: metrics.record_summarizer(
            model, usage, cost, prices.dollars(cost)
        ),
        estimate=estimate,
        pace=conversations.summary_pace(config),
        one_at_a_time=conversations.single_slot(config),
    )
