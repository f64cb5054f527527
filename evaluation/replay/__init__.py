"""The replay benchmark (``compaction-proxy eval --replay``): what whole agent
sessions cost, turn by turn, through a real proxy and through baselines, under a
simulated provider prompt cache.

Offline and off the proxy's request path: nothing in ``proxy/`` or
``compaction/`` imports it. :mod:`~evaluation.replay.sessions` cuts fixture
conversations into turns; :mod:`~evaluation.replay.client` sends them through
``compaction-proxy serve`` (:mod:`~evaluation.replay.serve`) to the loopback
upstream (:mod:`~evaluation.replay.upstream`), which answers with each
session's real next turn, summarizes with a stand-in model
(:mod:`~evaluation.replay.standin`) and bills every prompt through the cache
simulator (:mod:`~evaluation.replay.cache`, :mod:`~evaluation.replay.records`);
:mod:`~evaluation.replay.baselines` are priced the same way in-process;
:mod:`~evaluation.replay.facts` scores what the next turns needed;
:mod:`~evaluation.replay.run` drives it all and :mod:`~evaluation.replay.report`
prints the figures.
"""

from evaluation.replay.baselines import BASELINES, Sent, input_limit
from evaluation.replay.cache import CacheRead, PromptCache, SegmentTokens
from evaluation.replay.facts import Fact, SessionFacts, candidates
from evaluation.replay.records import Call, FactScore, Recorder
from evaluation.replay.report import Row, markdown, rows
from evaluation.replay.run import Options, Run, replay
from evaluation.replay.sessions import Session, load_sessions, session_of

__all__ = [
    "BASELINES",
    "CacheRead",
    "Call",
    "Fact",
    "FactScore",
    "Options",
    "PromptCache",
    "Recorder",
    "Row",
    "Run",
    "SegmentTokens",
    "Sent",
    "Session",
    "SessionFacts",
    "candidates",
    "input_limit",
    "load_sessions",
    "markdown",
    "replay",
    "rows",
    "session_of",
]
