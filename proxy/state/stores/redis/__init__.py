"""The Redis backend, shared by every replica: the store (:mod:`.store`, its
key scheme in that module's docstring, with checkpoints and the rows kept by
model), the parts it composes — keys, clock, lock and transactions
(:mod:`.core`), events and liveness (:mod:`.events`), figures and sessions
(:mod:`.figures`), whether a session holds a checkpoint (:mod:`.held`) —
what a reply may be (:mod:`.replies`) and the Lua scripts it runs
(:mod:`.scripts`)."""

from proxy.state.stores.redis.replies import GarbledReply
from proxy.state.stores.redis.store import (
    DEFAULT_KEY_PREFIX,
    TRANSACTION_ATTEMPTS,
    TRANSACTION_BACKOFF,
    Contended,
    RedisStore,
)

__all__ = [
    "DEFAULT_KEY_PREFIX",
    "TRANSACTION_ATTEMPTS",
    "TRANSACTION_BACKOFF",
    "Contended",
    "GarbledReply",
    "RedisStore",
]
