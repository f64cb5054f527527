"""One test per provider wording of "the prompt is too long"."""

from __future__ import annotations

import orjson
import pytest

from proxy.upstream.overflow import detect_overflow


def body(message: str, **error: object) -> bytes:
    return orjson.dumps({"error": {"message": message, **error}})


WORDINGS = [
    # (provider, status, body, stated window)
    (
        "OpenAI",
        400,
        body(
            "This model's maximum context length is 128000 tokens. However, your messages resulted "
            "in 130512 tokens. Please reduce the length of the messages.",
            type="invalid_request_error",
            code="context_length_exceeded",
        ),
        128000,
    ),
    (
        "OpenAI, newer",
        400,
        body(
            "Your input exceeds the context window of this model. Please adjust your input and try "
            "again.",
            type="invalid_request_error",
            code="context_length_exceeded",
        ),
        None,
    ),
    (
        "Azure OpenAI",
        400,
        body(
            "This model's maximum context length is 8192 tokens, however you requested 9000 tokens "
            "(9000 in your prompt; 0 for the completion). Please reduce your prompt; or completion "
            "length.",
            code="context_length_exceeded",
        ),
        8192,
    ),
    (
        "vLLM",
        400,
        orjson.dumps(
            {
                "object": "error",
                "message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
                "(4000 in the messages, 1000 in the completion). Please reduce the length of the "
                "messages or completion.",
                "type": "BadRequestError",
                "code": 400,
            }
        ),
        4096,
    ),
    (
        "vLLM, newer",
        400,
        body(
            "The decoder prompt (length 9000) is longer than the maximum model length of 8192. "
            "Make sure that `max_model_len` is no smaller than the number of text tokens."
        ),
        8192,
    ),
    (
        "llama.cpp server",
        400,
        orjson.dumps(
            {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size. try increasing the context size or "
                    "enable context shift",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 14429,
                    "n_ctx": 8192,
                }
            }
        ),
        8192,
    ),
    (
        "llama.cpp server, newer",
        400,
        body(
            "request (4390 tokens) exceeds the available context size (4096 tokens), try "
            "increasing it",
            type="exceed_context_size_error",
        ),
        4096,
    ),
    (
        "llama.cpp server, 500",
        500,
        body("Context size has been exceeded.", type="server_error"),
        None,
    ),
    (
        "LM Studio",
        400,
        orjson.dumps(
            {
                "error": "Trying to keep the first 10136 tokens when context the overflows. However, the model is "
                "loaded with context length of only 7866 tokens, which is not enough. Try to load the "
                "model with a larger context length, or provide a shorter input"
            }
        ),
        7866,
    ),
    (
        "LM Studio, n_keep",
        400,
        orjson.dumps(
            {
                "error": "The number of tokens to keep from the initial prompt is greater than the context length "
                "(n_keep: 13055>= n_ctx: 4096). Try to load the model with a larger context length, or "
                "provide a shorter input."
            }
        ),
        4096,
    ),
    ("Ollama", 400, body("input length exceeds maximum context length"), None),
    (
        "Ollama, prompt too long",
        500,
        orjson.dumps({"error": "prompt too long; exceeded max context length by 312 tokens"}),
        None,
    ),
    (
        "OpenRouter",
        400,
        body(
            "This endpoint's maximum context length is 131072 tokens. However, you requested about "
            "140000 tokens (139000 of text input, 1000 in the output). Please reduce the length of "
            'either one, or use the "middle-out" transform to compress your prompt automatically.',
            code=400,
        ),
        131072,
    ),
    (
        "Groq",
        400,
        body(
            "Please reduce the length of the messages or completion.",
            type="invalid_request_error",
            param="messages",
            code="context_length_exceeded",
        ),
        None,
    ),
    (
        "Mistral",
        400,
        orjson.dumps(
            {
                "object": "error",
                "message": "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 "
                "maximum context length",
                "type": "invalid_request_message_error",
                "code": "3051",
            }
        ),
        32768,
    ),
    (
        "DeepSeek",
        400,
        body(
            "This model's maximum context length is 65536 tokens. However, you requested 70123 "
            "tokens (70123 in the messages, 0 in the completion). Please reduce the length of the "
            "messages or completion.",
            type="invalid_request_error",
        ),
        65536,
    ),
    (
        "Anthropic-compatible",
        400,
        orjson.dumps(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 208000 tokens > 200000 maximum",
                },
            }
        ),
        200000,
    ),
    (
        "Gemini-compatible",
        400,
        orjson.dumps(
            [
                {
                    "error": {
                        "code": 400,
                        "message": "The input token count (1200000) exceeds the maximum number of tokens allowed "
                        "(1048576).",
                        "status": "INVALID_ARGUMENT",
                    }
                }
            ]
        ),
        1048576,
    ),
    (
        "Hugging Face TGI",
        422,
        orjson.dumps(
            {
                "error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: "
                "4000 `inputs` tokens and 500 `max_new_tokens`",
                "error_type": "validation",
            }
        ),
        4096,
    ),
]


@pytest.mark.parametrize(
    ("provider", "status", "raw", "window"), WORDINGS, ids=[w[0] for w in WORDINGS]
)
def test_each_provider_wording_is_recognized_with_its_window(
    provider: str, status: int, raw: bytes, window: int | None
) -> None:
    overflow = detect_overflow(status, raw)
    assert overflow is not None, provider
    assert overflow.limit == window


@pytest.mark.parametrize(
    ("status", "raw"),
    [
        (
            429,
            body(
                "Request too large for model `llama3-70b` on tokens per minute (TPM): Limit "
                "6000, Requested 9000",
                type="tokens",
                code="rate_limit_exceeded",
            ),
        ),
        (
            400,
            body("Invalid value for 'temperature': must be between 0 and 2.", code="invalid_value"),
        ),
        (401, body("Incorrect API key provided", code="invalid_api_key")),
        (500, b"<html>Internal Server Error</html>"),
        (400, b"not json at all"),
    ],
)
def test_other_errors_are_not_overflows(status: int, raw: bytes) -> None:
    assert detect_overflow(status, raw) is None
