"""Loopback fakes of the local servers' metadata endpoints, in their documented shapes.

Each fake is a real HTTP server (uvicorn on 127.0.0.1, see
:func:`tests.proxy.servers.serve_in_thread`) answering the paths it is given
with the bytes given, recording every request, and answering chat requests
like an OpenAI-compatible server, so a proxy can be put in front of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.proxy.servers import serve_in_thread

Answer = tuple[int, bytes]


def llama_cpp_props(n_ctx: int, total_slots: int = 1) -> bytes:
    """llama.cpp ``GET /props``, as its server README documents it
    (https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md,
    "GET /props: Get server global properties"), cut to the fields around
    the two read."""
    return orjson.dumps(
        {
            "default_generation_settings": {
                "id": 0,
                "id_task": -1,
                "n_ctx": n_ctx,
                "speculative": False,
                "is_processing": False,
                "params": {"n_predict": -1, "temperature": 0.8, "top_k": 40},
            },
            "total_slots": total_slots,
            "model_path": "/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            "chat_template": "{% for message in messages %}…{% endfor %}",
            "modalities": {"vision": False, "audio": False},
            "build_info": "b5000-abcdef0",
        }
    )


def overflow_error(window: int, tokens: int) -> Answer:
    """The OpenAI-shaped context-length error (llama-cpp-python's, vLLM's)."""
    message = (
        f"This model's maximum context length is {window} tokens. However, you "
        f"requested {tokens} tokens. Please reduce the length of the messages."
    )
    error = {"message": message, "type": "invalid_request_error", "code": None}
    return 400, orjson.dumps({"error": error})


def llama_cpp_models(model: str, n_ctx_train: int) -> bytes:
    """llama.cpp ``GET /v1/models`` (same README, "GET /v1/models"): its
    ``meta.n_ctx_train`` is the trained window, not the one served."""
    return orjson.dumps(
        {
            "object": "list",
            "data": [
                {
                    "id": model,
                    "object": "model",
                    "created": 1735142223,
                    "owned_by": "llamacpp",
                    "meta": {"vocab_type": 2, "n_vocab": 151936, "n_ctx_train": n_ctx_train},
                }
            ],
        }
    )


def vllm_models(model: str, max_model_len: int) -> bytes:
    """vLLM ``GET /v1/models`` (its OpenAI-compatible server,
    https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html;
    the ``ModelCard`` of ``vllm/entrypoints/openai/protocol.py``)."""
    card = {
        "id": model,
        "object": "model",
        "created": 1735142223,
        "owned_by": "vllm",
        "root": f"Qwen/{model}",
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [{"id": "modelperm-1", "object": "model_permission", "allow_sampling": True}],
    }
    return orjson.dumps({"object": "list", "data": [card]})


def openrouter_models(model: str, context_length: int, provider_length: int) -> bytes:
    """OpenRouter ``GET /api/v1/models``
    (https://openrouter.ai/docs/api-reference/list-available-models)."""
    entry = {
        "id": model,
        "name": "Qwen: Qwen2.5 Coder 32B Instruct",
        "created": 1731368400,
        "description": "A code model.",
        "context_length": context_length,
        "architecture": {"modality": "text->text", "tokenizer": "Qwen"},
        "pricing": {"prompt": "0.00000007", "completion": "0.00000016"},
        "top_provider": {
            "context_length": provider_length,
            "max_completion_tokens": 8192,
            "is_moderated": False,
        },
    }
    other = {**entry, "id": "openai/gpt-4o", "context_length": 128000}
    return orjson.dumps({"data": [other, entry]})


def llama_cpp_python_models(model: str) -> bytes:
    """llama-cpp-python ``GET /v1/models`` (``get_models`` in
    ``llama_cpp/server/app.py``): names only, no window."""
    entry = {"id": model, "object": "model", "owned_by": "me", "permissions": []}
    return orjson.dumps({"object": "list", "data": [entry]})


def lmstudio_models(model: str, *, loaded: int | None, max_length: int) -> bytes:
    """LM Studio ``GET /api/v0/models`` (REST API v0,
    https://lmstudio.ai/docs/developer/rest/endpoints): a loaded model has a
    ``loaded_context_length``; ``max_context_length`` is the model's own."""
    entry: dict[str, Any] = {
        "id": model,
        "object": "model",
        "type": "llm",
        "publisher": "lmstudio-community",
        "arch": "qwen2",
        "compatibility_type": "gguf",
        "quantization": "Q4_K_M",
        "state": "loaded" if loaded else "not-loaded",
        "max_context_length": max_length,
    }
    if loaded:
        entry["loaded_context_length"] = loaded
    embedding = {**entry, "id": "text-embedding-nomic", "type": "embeddings"}
    return orjson.dumps({"object": "list", "data": [embedding, entry]})


def ollama_show(*, num_ctx: int | None, trained: int = 32768) -> bytes:
    """Ollama ``POST /api/show`` (https://github.com/ollama/ollama/blob/main/docs/api.md,
    "Show Model Information"): ``parameters`` is the Modelfile's, one
    ``name value`` a line; ``model_info`` holds the trained window."""
    parameters = 'stop "<|im_start|>"\nstop "<|im_end|>"\ntemperature 0.7'
    if num_ctx is not None:
        parameters += f"\nnum_ctx {num_ctx}"
    return orjson.dumps(
        {
            "modelfile": "FROM qwen2.5-coder",
            "parameters": parameters,
            "template": "{{ .Prompt }}",
            "details": {"format": "gguf", "family": "qwen2", "parameter_size": "1.5B"},
            "model_info": {"general.architecture": "qwen2", "qwen2.context_length": trained},
            "capabilities": ["completion", "tools"],
        }
    )


def ollama_ps(model: str, context_length: int) -> bytes:
    """Ollama ``GET /api/ps`` (same page, "List Running Models"): a loaded model
    with the ``context_length`` it was given."""
    entry = {
        "name": f"{model}:latest",
        "model": f"{model}:latest",
        "size": 1_900_000_000,
        "digest": "a8b0c51577010a279d933d14c2a8ab4b268079d44c5c8830c0a93900f1827c67",
        "details": {"format": "gguf", "family": "qwen2", "parameter_size": "1.5B"},
        "expires_at": "2026-12-01T20:00:00Z",
        "size_vram": 0,
        "context_length": context_length,
    }
    return orjson.dumps({"models": [entry]})


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class MetadataServer:
    """A server answering ``answers[(method, path)]``; a 404 for anything else
    but chat, which it answers (not streamed) like any OpenAI-compatible server."""

    answers: dict[tuple[str, str], Answer] = field(default_factory=dict)
    #: Answers the next chat requests get instead, in order (an overflow error).
    chat_answers: list[Answer] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)

    def asked(self, path: str) -> int:
        """How many times ``path`` was asked for."""
        return sum(1 for s in self.seen if s.path == path)

    @property
    def probes(self) -> list[Seen]:
        return [s for s in self.seen if not s.path.endswith("/chat/completions")]

    async def _any(self, request: Request) -> Response:
        body = await request.body()
        seen = Seen(request.method, request.url.path, dict(request.headers), body)
        self.seen.append(seen)
        if seen.path == "/v1/chat/completions":
            if self.chat_answers:
                status, answer = self.chat_answers.pop(0)
                return Response(answer, status_code=status, media_type="application/json")
            return _chat(orjson.loads(body))
        status, answer = self.answers.get((seen.method, seen.path), (404, b'{"error":"no"}'))
        return Response(answer, status_code=status, media_type="application/json")

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{path:path}", self._any, methods=["GET", "POST"])])


def _chat(body: dict[str, Any]) -> Response:
    return JSONResponse(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "fine"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
        }
    )


@contextmanager
def serving(server: MetadataServer) -> Iterator[str]:
    """``server`` on a free loopback port; yields its root URL (no ``/v1``)."""
    with serve_in_thread(server.app()) as url:
        yield url
