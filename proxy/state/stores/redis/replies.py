"""What a Redis reply may be, and what it is when it is not.

A Redis that answers what no Redis would — nil to a SET, an integer where a
hash belongs, bytes that are not the JSON written — is a store that is down:
:func:`expect` checks a reply's type, and :func:`garbage_is_a_store_error`
turns the errors reading such a reply causes into :class:`GarbledReply` (a
:class:`~proxy.state.stores.base.StoreError`), never a ``TypeError`` from deep
in a caller.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

from proxy.state.stores.base import StoreError

_T = TypeVar("_T")


class GarbledReply(StoreError):
    """Redis answered what it never would: a reply of the wrong type, bytes that
    do not decode. The store is treated as down."""


async def awaited(pending: Any) -> Any:
    # redis-py types every command as "value or awaitable"; the asyncio client
    # always returns an awaitable.
    return await pending


def expect(reply: Any, kinds: type | tuple[type, ...], command: str) -> Any:
    """``reply`` if it is of ``kinds``; else the store is answering garbage."""
    if isinstance(reply, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise GarbledReply(f"Redis answered {command} with a boolean")
    if not isinstance(reply, kinds):
        raise GarbledReply(f"Redis answered {command} with {type(reply).__name__}")
    return reply


#: What a reply of the wrong shape raises as it is read or decoded.
GARBLE: Final = (TypeError, ValueError, AttributeError, KeyError, IndexError)


def garbage_is_a_store_error(
    method: Callable[..., Awaitable[_T]],
) -> Callable[..., Awaitable[_T]]:
    """``method`` with the errors a garbled reply causes (a nil unpacked, bytes
    that are no JSON) raised as :class:`GarbledReply`, the cause kept."""

    @functools.wraps(method)
    async def translated(*args: Any, **kwargs: Any) -> _T:
        try:
            return await method(*args, **kwargs)
        except StoreError:
            raise
        except GARBLE as exc:
            raise GarbledReply(f"{method.__name__}: {type(exc).__name__}") from exc

    return translated
