"""The figures of one answered chat request, for :class:`proxy.recorder.Recorder`.

Apart from the recorder, which the app's state holds: this reads the
handler's types, which the state must not import.
"""

from __future__ import annotations

from proxy.call import Call
from proxy.conversation import Prepared
from proxy.stores import RequestRecord


def request_record(call: Call, prepared: Prepared, status: int, ms: float) -> RequestRecord:
    """The figures of one answered request (``status``: the upstream's, or the proxy's)."""
    result = prepared.result
    return RequestRecord(
        session=prepared.session,
        owner=call.owner,
        model=call.config.model,
        api=call.dialect.name,
        stage=result.stage,
        reason=result.reason,
        tokens_before=result.tokens_before,
        tokens_after=result.tokens_after,
        input_limit=result.input_limit,
        trigger=result.trigger,
        status=status,
        ms=ms,
        summarizer_calls=result.summarizer_calls,
        summarizer_tokens=call.summarizer_tokens,
        checkpoint_id=prepared.checkpoint.id if prepared.checkpoint is not None else None,
    )
