"""The store contract as small protocols: every backend implements every one of them."""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import pytest

from proxy.state.stores import (
    MemoryStore,
    RedisStore,
    ResilientStore,
    SQLiteStore,
    Store,
)
from proxy.state.stores.resilient import _Guarded, _must_answer
from tests.proxy.state.stores.conftest import Backend

pytestmark = pytest.mark.anyio

#: The concerns :class:`Store` is made of, as it names them.
CONCERNS: tuple[Any, ...] = tuple(base for base in Store.__bases__ if base is not Protocol)
BACKEND_CLASSES = (MemoryStore, SQLiteStore, RedisStore)


def members(protocol: Any) -> set[str]:
    """What ``protocol`` itself declares: its methods and its attributes."""
    methods = {
        name
        for name, value in vars(protocol).items()
        if inspect.isfunction(value) and not name.startswith("_")
    }
    return methods | set(vars(protocol).get("__annotations__", {}))


def parameters(function: Any) -> list[tuple[str, Any, Any]]:
    """Name, kind and default of each parameter: what a caller relies on
    (the return annotation differs where a lock is written as a generator)."""
    signature = inspect.signature(function)
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def test_store_is_only_the_concerns_put_together() -> None:
    assert members(Store) == set()
    declared = [members(concern) for concern in CONCERNS]
    every = set().union(*declared)
    assert sum(len(names) for names in declared) == len(every)  # no member in two concerns
    assert all(0 < len(names) <= 6 for names in declared)  # small, and none empty


async def test_every_backend_is_an_instance_of_every_concern(backend: Backend) -> None:
    store = backend.open()
    for concern in (*CONCERNS, Store):
        assert isinstance(store, concern), concern.__name__


@pytest.mark.parametrize("cls", BACKEND_CLASSES, ids=lambda cls: cls.__name__)
def test_every_backend_method_takes_what_its_concern_declares(cls: type[Any]) -> None:
    for concern in CONCERNS:
        for name in members(concern):
            declared = vars(concern).get(name)  # an attribute is only annotated
            if inspect.isfunction(declared):
                assert parameters(getattr(cls, name)) == parameters(declared), name
            else:
                assert isinstance(getattr(cls, name), bool), name


def test_the_resilient_store_guards_every_operation_with_the_declared_signature() -> None:
    """The contract grows (owners came with per-caller state): the wrapper must follow,
    either by guarding the protocol's own method or by a method written out alike."""
    for concern in CONCERNS:
        for name in members(concern):
            declared = vars(concern).get(name)
            if not inspect.isfunction(declared):
                continue
            found = inspect.getattr_static(ResilientStore, name)
            if isinstance(found, _Guarded):
                assert found.declared is declared, name
            else:
                assert inspect.signature(found) == inspect.signature(declared), name


def test_an_operation_guarded_under_another_name_is_refused() -> None:
    with pytest.raises(Exception) as caught:  # which type depends on the Python version

        class Crossed:
            get = _must_answer(Store.originals)

        del Crossed
    # Python 3.11 wraps what __set_name__ raises in a RuntimeError; 3.12 does not.
    error = caught.value.__cause__ or caught.value
    assert isinstance(error, TypeError)
    assert "get is declared as originals" in str(error)
