"""Asking each probe of the compacted conversation, and grading the answer.

Two requests per probe to an OpenAI-compatible chat endpoint (``--judge
URL``), both through the proxy's own :class:`~proxy.upstream.summarizer.UpstreamSummarizer`
(any ``(messages, max_tokens) -> text`` call will do):

1. *ask*: the compacted conversation as a transcript
   (:func:`compaction.prompts.serialize_messages`) and the probe's question;
   the model answers from the transcript alone, or says it cannot tell;
2. *grade*: the question, the reference answer drawn from the original
   conversation and the answer; the model replies ``CORRECT`` or
   ``INCORRECT``. Anything else counts as incorrect.
"""

from __future__ import annotations

from collections.abc import Sequence

from compaction import Message, Summarizer
from compaction.summary.prompts import serialize_messages
from evaluation.probes import Probe

ANSWER_TOKENS = 200
GRADE_TOKENS = 5
#: Tool outputs are cut to this in the transcript the judge reads.
TRANSCRIPT_TOOL_CHARS = 8_000

_ASK = (
    "You are shown the transcript of a conversation between a user, an assistant and "
    "its tools. Answer the question using only what the transcript says. If the "
    "transcript does not tell, answer exactly: cannot tell."
)
_GRADE = (
    "You grade answers. Given a question, the reference answer and a candidate answer, "
    "reply CORRECT if the candidate states the same facts as the reference (wording may "
    "differ, extra detail is fine), otherwise INCORRECT. Reply with the one word."
)


class Judge:
    """Grades probes with a chat model; counts what it asked."""

    def __init__(self, model: Summarizer) -> None:
        self._model = model
        self.calls = 0

    async def answer(self, messages: Sequence[Message], question: str) -> str:
        transcript = serialize_messages(messages, TRANSCRIPT_TOOL_CHARS)
        prompt = f"<transcript>\n{transcript}\n</transcript>\n\nQuestion: {question}"
        self.calls += 1
        return await self._model(
            [{"role": "system", "content": _ASK}, {"role": "user", "content": prompt}],
            ANSWER_TOKENS,
        )

    async def grade(self, messages: Sequence[Message], probe: Probe) -> bool:
        answer = await self.answer(messages, probe.question)
        prompt = (
            f"Question: {probe.question}\nReference answer: {probe.answer}\n"
            f"Candidate answer: {answer}"
        )
        self.calls += 1
        verdict = await self._model(
            [{"role": "system", "content": _GRADE}, {"role": "user", "content": prompt}],
            GRADE_TOKENS,
        )
        return verdict.strip().upper().startswith("CORRECT")
