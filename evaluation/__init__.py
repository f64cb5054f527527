"""evaluation: how much a compacted request still tells a model (``compaction-proxy eval``).

Offline and off the proxy's request path: nothing in ``proxy/`` or
``compaction/`` imports it. :func:`evaluate` compacts request bodies
(:mod:`evaluation.corpus`) with the engine's own :func:`compaction.compact`
at each window and strategy, and scores probes drawn from each original
conversation (:mod:`evaluation.probes`, which read it as the summaries do,
and :mod:`evaluation.facts`, rules of the eval's own) by presence and, with a
:class:`Judge`, by asking a model (:mod:`evaluation.judge`);
:mod:`evaluation.repeats` measures how often agents repeat a tool call with
no compaction at all; :mod:`evaluation.report` prints the figures.
"""

from evaluation.corpus import Body, read_bodies
from evaluation.facts import FACT_KINDS, Fact, draw_facts
from evaluation.judge import Judge
from evaluation.probes import KINDS, Probe, generate_probes, request_text
from evaluation.repeats import RepeatReport, Repeats, conversation_repeats, natural_repeats
from evaluation.report import report_json, report_table
from evaluation.run import Cell, CountingSummarizer, Tally, evaluate

__all__ = [
    "FACT_KINDS",
    "KINDS",
    "Body",
    "Cell",
    "CountingSummarizer",
    "Fact",
    "Judge",
    "Probe",
    "RepeatReport",
    "Repeats",
    "Tally",
    "conversation_repeats",
    "draw_facts",
    "evaluate",
    "generate_probes",
    "natural_repeats",
    "read_bodies",
    "report_json",
    "report_table",
    "request_text",
]
