"""Request features and workload-class matching.

The router reads only the JSON fields that routing needs and forwards the original body bytes
unchanged (it never re-serializes a request). The features, in the notation of seed 004 §4:

  I_r    prompt tokens: the length of a token-id prompt; characters / `chars_per_token` for
         text; for chat, the summed length of the messages' text content
  maxtok the request's `max_tokens` (chat also accepts `max_completion_tokens`); absent = unbounded
  n      sequences the request asks for (`n` choices x number of prompts in a batch)
  Õ_r    predicted output tokens: the class's mean output length, capped by `max_tokens`
         (Helix §5.2 estimates with the average output length; a request cannot exceed its cap)

A request belongs to the first `WorkloadClass` of its model whose `ClassMatch` accepts it (bounds
are [min, max)); an absent `max_tokens` counts as unbounded, so it passes every `*_min` bound and
fails every `*_max` bound. When no class matches, the model's last class is used (the table says
the last class should match everything; this keeps a slightly wrong table serving).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hetcompile.ir.routing import ClassMatch


class BadRequest(ValueError):
    """The client's body cannot be routed (not JSON, not an object, wrong field types)."""


@dataclass(slots=True)
class RequestInfo:
    """What routing knows about one request."""

    model: str | None
    prompt_tokens: float
    max_tokens: int | None
    n_seqs: int
    stream: bool


def _text_len(content: object) -> int:
    """Characters of text in a chat message `content` (a string or a list of typed parts)."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    total += len(text)
            elif isinstance(part, str):
                total += len(part)
        return total
    return 0


def chat_prompt_tokens(messages: object, chars_per_token: float) -> float:
    """I_r of a chat request: summed text content of all messages / chars_per_token."""
    if not isinstance(messages, list):
        return 0.0
    chars = 0
    for m in messages:
        if isinstance(m, dict):
            chars += _text_len(m.get("content"))
    return chars / chars_per_token


def completion_prompt_tokens(prompt: object, chars_per_token: float) -> tuple[float, int]:
    """(I_r, number of prompts) of a completions request.

    `prompt` may be a string, a list of token ids, a list of strings or a list of token-id
    lists (a batch); a batch sums its prompts (they all occupy KV at once).
    """
    if isinstance(prompt, str):
        return len(prompt) / chars_per_token, 1
    if isinstance(prompt, list):
        if not prompt:
            return 0.0, 1
        first = prompt[0]
        if isinstance(first, int):
            return float(len(prompt)), 1
        tokens = 0.0
        for p in prompt:
            if isinstance(p, str):
                tokens += len(p) / chars_per_token
            elif isinstance(p, list):
                tokens += len(p)
        return tokens, len(prompt)
    return 0.0, 1


def _int_or_none(v: object) -> int | None:
    # bool is an int in Python; a JSON `true` is not a token count
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    return None


def parse_request(body: bytes, chat: bool, chars_per_token: float) -> RequestInfo:
    """Read the routing fields of an OpenAI completions / chat body. Raises `BadRequest`."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise BadRequest("request body must be a JSON object")
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string")
    if chat:
        prompt_tokens = chat_prompt_tokens(obj.get("messages"), chars_per_token)
        n_prompts = 1
        max_tokens = _int_or_none(obj.get("max_completion_tokens"))
        if max_tokens is None:
            max_tokens = _int_or_none(obj.get("max_tokens"))
    else:
        prompt_tokens, n_prompts = completion_prompt_tokens(obj.get("prompt"), chars_per_token)
        max_tokens = _int_or_none(obj.get("max_tokens"))
    n = _int_or_none(obj.get("n"))
    n_seqs = n_prompts * (n if n is not None and n > 0 else 1)
    return RequestInfo(model, prompt_tokens, max_tokens, n_seqs, obj.get("stream") is True)


def class_matches(m: ClassMatch, prompt_tokens: float, max_tokens: int | None, headers: Mapping[str, str]) -> bool:
    """Whether a request with these features satisfies every bound of `m` (bounds are [min, max))."""
    if m.prompt_tokens_min is not None and prompt_tokens < m.prompt_tokens_min:
        return False
    if m.prompt_tokens_max is not None and prompt_tokens >= m.prompt_tokens_max:
        return False
    if m.max_tokens_min is not None and max_tokens is not None and max_tokens < m.max_tokens_min:
        return False
    if m.max_tokens_max is not None and (max_tokens is None or max_tokens >= m.max_tokens_max):
        return False
    if m.header is not None and headers.get(m.header.name) != m.header.value:
        return False
    return True


def match_class(matches: Sequence[ClassMatch], info: RequestInfo, headers: Mapping[str, str]) -> int:
    """Index of the first class whose match accepts the request; the last class when none does.

    `headers` must look names up case-insensitively (aiohttp's `request.headers` does).
    """
    for i, m in enumerate(matches):
        if class_matches(m, info.prompt_tokens, info.max_tokens, headers):
            return i
    return len(matches) - 1


def predicted_output_tokens(class_output_tokens: float, max_tokens: int | None) -> float:
    """Õ_r: the class mean output length, capped by the request's `max_tokens`."""
    if max_tokens is not None and max_tokens < class_output_tokens:
        return float(max(max_tokens, 0))
    return class_output_tokens
