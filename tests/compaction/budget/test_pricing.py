from __future__ import annotations

import pytest

from compaction import Profile
from compaction.budget.pricing import PRESETS, Prices, preset_for, priced


@pytest.mark.parametrize(
    ("host", "api", "expected"),
    [
        ("127.0.0.1", "chat", "local"),
        ("localhost", "anthropic", "local"),
        ("[::1]", "responses", "local"),
        ("192.168.1.20", "chat", "local"),
        ("api.anthropic.com", "anthropic", "anthropic"),
        ("openrouter.ai", "anthropic", "anthropic"),
        ("api.openai.com", "chat", "openai"),
        ("api.openai.com", "responses", "openai"),
        ("openrouter.ai", "chat", "openai"),
    ],
)
def test_auto_picks_the_preset_by_where_the_request_goes(
    host: str, api: str, expected: str
) -> None:
    assert preset_for("auto", api=api, host=host).name == expected


def test_a_named_preset_ignores_the_host() -> None:
    assert preset_for("none", host="127.0.0.1") == PRESETS["none"]


def test_a_call_is_priced_by_its_parts() -> None:
    prices = Prices(cache_read=0.1, cache_write=1.25, output=5.0)
    assert prices.cost(uncached=100, cache_read=1000, cache_write=200, output=10) == pytest.approx(
        100 + 100 + 250 + 50
    )
    # A prompt half read from the cache, half written to it.
    assert prices.prompt(1000, 500) == pytest.approx(50 + 625)
    assert prices.prompt(1000, 5000) == pytest.approx(100)


def test_dollars_need_an_input_price() -> None:
    assert Prices().dollars(1_000_000) is None
    assert Prices(input_per_mtok=3.0).dollars(2_000_000) == pytest.approx(6.0)


def test_the_fields_a_user_sets_override_the_preset_and_rename_it() -> None:
    base = PRESETS["anthropic"]
    assert priced(base) is base
    assert priced(base, input_per_mtok=3.0).name == "anthropic"
    custom = priced(base, cache_read=0.25, cache_lifetime=3600)
    assert (custom.cache_read, custom.cache_lifetime, custom.cache_write, custom.name) == (
        0.25,
        3600,
        1.25,
        "custom",
    )


def test_a_profile_resolves_its_prices() -> None:
    profile = Profile(pricing="openai", cache_write_price=1.25, input_price_per_mtok=1.25)
    prices = profile.prices(api="chat", host="127.0.0.1")
    assert (prices.cache_write, prices.cache_read, prices.input_per_mtok) == (1.25, 0.1, 1.25)
    with pytest.raises(ValueError, match="pricing must be one of"):
        Profile(pricing="cheap")  # type: ignore[arg-type]
