"""proxy/edge/paths.py: the pass-through's upstream URL, from the path as received."""

from __future__ import annotations

import re
from urllib.parse import unquote_to_bytes

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.edge.errors import BadRequest
from proxy.edge.paths import forward_url, raw_path_of

BASE = "http://upstream.test/api/v1"


def url(raw_path: bytes, query: bytes = b"") -> str:
    return forward_url(BASE, raw_path, query, prefix="v1")


@pytest.mark.parametrize(
    ("raw_path", "forwarded"),
    [
        (b"/v1/models", "/models"),
        (b"/v1/models/", "/models/"),  # a trailing slash is kept
        (b"/v1/", "/"),
        (b"/v1/files/file-abc/content", "/files/file-abc/content"),
        # An encoded / stays inside its segment; the client's spelling is kept.
        (b"/v1/models/accounts%2Ffireworks%2fllama", "/models/accounts%2Ffireworks%2fllama"),
        (b"/v1/models/ft%3Agpt-4o%3Aorg", "/models/ft%3Agpt-4o%3Aorg"),
        (b"/v1/models/ft:gpt-4o:org", "/models/ft:gpt-4o:org"),
        (b"/v1/a%3Fb%23c", "/a%3Fb%23c"),
        # Bytes that may not stand in a path are encoded, not sent raw.
        (b'/v1/a"b<c>{d}|e^f`g\\h', "/a%22b%3Cc%3E%7Bd%7D%7Ce%5Ef%60g%5Ch"),
        (b"/v1/caf\xc3\xa9", "/caf%C3%A9"),
        (b"/v1/%ff%FE", "/%ff%FE"),  # encoded bytes that are not UTF-8 pass as they are
        (b"/v%31/models", "/models"),  # the route prefix, however spelled
        (b"/v1/..a/a../.../x.y", "/..a/a../.../x.y"),  # dots that are not dot segments
    ],
)
def test_the_raw_path_is_forwarded_under_the_base_path(raw_path: bytes, forwarded: str) -> None:
    assert url(raw_path) == BASE + forwarded


@pytest.mark.parametrize(
    ("raw_path", "needle"),
    [
        (b"/v1/../admin", "'.' or '..'"),
        (b"/v1/%2e%2e/%2e%2e/admin", "'.' or '..'"),
        (b"/v1/%2E%2e/admin", "'.' or '..'"),
        (b"/v1/.%2e", "'.' or '..'"),
        (b"/v1/models/.", "'.' or '..'"),
        (b"/v1/a/./b", "'.' or '..'"),
        # For upstreams that decode %2F or treat \ as / before resolving dots.
        (b"/v1/x%2F..%2F..%2Fadmin", "'.' or '..'"),
        (b"/v1/..%5Cadmin", "'.' or '..'"),
        (b"/v1/a%00b", "control character"),
        (b"/v1/a\x00b", "control character"),
        (b"/v1/a%20b", "control character or a space"),
        (b"/v1/a%0d%0aHost:%20evil", "control character"),
        (b"/v1/a%7f", "control character"),
        (b"/v1/a%zzb", "malformed"),
        (b"/v1/a%2", "malformed"),
        (b"/v1//models", "empty segment"),
        (b"/v1/models//x", "empty segment"),
        (b"/v1%2Fmodels", "must start with /v1/"),
        (b"/v2/models", "must start with /v1/"),
    ],
)
def test_paths_that_could_leave_or_break_the_target_are_refused(
    raw_path: bytes, needle: str
) -> None:
    with pytest.raises(BadRequest, match=re.escape(needle)) as refused:
        url(raw_path)
    assert refused.value.status == 400


def test_the_query_is_forwarded_as_received() -> None:
    assert url(b"/v1/files", b"purpose=fine-tune&after=a%2Fb&x=1%") == (
        BASE + "/files?purpose=fine-tune&after=a%2Fb&x=1%"
    )
    assert url(b"/v1/files", b"q=caf\xc3\xa9#x") == BASE + "/files?q=caf%C3%A9%23x"
    for query in (b"a=b c", b"a=\x00", b"a=\r\nHost: evil", b"a=\x7f"):
        with pytest.raises(BadRequest, match="query string"):
            url(b"/v1/files", query)


def test_a_server_without_raw_path_gets_the_decoded_path_re_encoded() -> None:
    assert raw_path_of("/v1/a b", None) == b"/v1/a%20b"
    assert raw_path_of("/v1/x", b"/v1/%78") == b"/v1/%78"


_SEGMENT_BYTES = st.binary(max_size=12) | st.sampled_from(
    [b".", b"..", b"%2e", b"%2E%2e", b"%2F", b"%2f..", b"%00", b"%20", b"%", b"%zz", b"%ff"]
)


@given(st.lists(_SEGMENT_BYTES, max_size=6), st.binary(max_size=20))
def test_whatever_the_raw_path_the_target_stays_under_the_base_path(
    segments: list[bytes], query: bytes
) -> None:
    raw_path = b"/v1/" + b"/".join(segments)
    try:
        target = url(raw_path, query)
    except BadRequest:
        return
    assert target.startswith(BASE + "/")
    assert target.isascii()
    assert not re.search(r"[\x00-\x20\x7f]", target)
    path, _, _ = target[len(BASE) + 1 :].partition("?")
    forwarded = path.split("/")
    for segment in forwarded:
        decoded = unquote_to_bytes(segment)
        assert not re.search(rb"(?:\A|[/\\])\.\.?(?:\Z|[/\\])", decoded)
    # Nothing was lost or merged: the same segments, decoded, as the client's.
    assert [unquote_to_bytes(s) for s in forwarded] == [
        unquote_to_bytes(s) for s in raw_path.split(b"/")[2:]
    ]


_PLAIN = st.text(alphabet="abcxyz0123456789-_~:@!$&'()*+,;=", min_size=1, max_size=10)


@given(st.lists(_PLAIN.filter(lambda s: s.strip(".") != ""), min_size=1, max_size=5))
def test_an_ordinary_path_goes_out_unchanged(segments: list[str]) -> None:
    path = "/".join(segments)
    assert url(b"/v1/" + path.encode()) == f"{BASE}/{path}"
