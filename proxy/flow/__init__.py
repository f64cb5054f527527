"""proxy.flow: one compacted request, in the order it happens.

    services.py  the services a request is served with (built by proxy.app)
    read.py      the body → a Call: plain data (dialect, model settings, the conversation)
    continued.py a growing conversation's next body, read as the previous one plus its tail
    handler.py   the entry, handle_chat: read → compact → send → relay | overflow → retry
    exchange.py  the request being answered: its services, watch and spending, and its acts
    retry.py     an overflow (stated, or an empty stream), what it teaches, the one retry
    summaries.py the llm summarizer a request's compaction asks, in its API, with its key
    manual.py    ``/compact [instructions]`` and its reply
    send.py      headers for the upstream, sending, the transport's errors made ours
    relay/       the one relay of every answer (plain or in recall rounds), stream ends
    recall.py    a request handed to proxy.recall: its plan, and its rounds to the relay
    usage.py     the upstream's own token count, read off the answer as it passes
    answered/    once the client has the answer: finish (metrics, the log line), the
                 bill (Spent: its work beside the answer), the figures for the recorder
    passthrough.py  every other /v1 path, forwarded as it came

"The prompt is too long" in any provider's words is read by
:mod:`proxy.upstream.overflow`.

The per-conversation work a request triggers (checkpoints, locks, background
preparation) is :mod:`proxy.session`.
"""
