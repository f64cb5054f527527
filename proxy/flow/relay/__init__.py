"""proxy.flow.relay: the upstream's answer, to the client.

response.py    Relay: every answer, whole or streamed, plain or in recall rounds
stream_end.py  whether a stream ended as its API ends one; what is done when not
"""

from proxy.flow.relay.response import HELD_AT_MOST, WHOLE_BELOW, After, Relay, RoundSource
from proxy.flow.relay.stream_end import Cut, StreamEnd

__all__ = ["HELD_AT_MOST", "WHOLE_BELOW", "After", "Cut", "Relay", "RoundSource", "StreamEnd"]
