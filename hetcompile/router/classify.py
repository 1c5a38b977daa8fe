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

A body routing cannot use is refused with `BadRequest` (the proxy answers 400): not UTF-8, not
JSON or nested past the parser's recursion limit, not an object, or a routing field of the
wrong type (`model` not a string, `messages` not an array of message objects, `prompt` none of
its four shapes, `max_tokens` / `max_completion_tokens` / `n` not an integer within ±(2**53 - 1),
`stream` not a boolean). Fields routing does not read are left to the replica.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hetcompile.plan.routing import ClassMatch


class BadRequest(ValueError):
    """The client's body cannot be routed (not JSON, not an object, wrong field types).

    `param` names the offending field, as the OpenAI error object's `param` does.
    """

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


# RFC 8259 §6: integers beyond ±(2**53 - 1) are not interoperable, and the load estimate does
# float arithmetic on `n` and `max_tokens`: a larger one is refused instead of overflowing
MAX_JSON_INT = 2**53 - 1


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


def _int_field(obj: dict, name: str) -> int | None:
    """An optional integer field: absent or null is None; anything but an integer is refused.

    A float with an integral value (`5.0`) is the same JSON number as `5` and is accepted;
    bool is an int in Python, but a JSON `true` is not a token count.
    """
    v = obj.get(name)
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():  # is_integer() is False for inf and nan
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool):
        raise BadRequest(f"'{name}' must be an integer, got {_json_type(v)}", name)
    if not -MAX_JSON_INT <= v <= MAX_JSON_INT:
        raise BadRequest(f"'{name}' must be between {-MAX_JSON_INT} and {MAX_JSON_INT}", name)
    return v


def _json_type(v: object) -> str:
    """The JSON name of a parsed value's type, for error messages."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, float) and not math.isfinite(v):  # not for int: isfinite(10**400) overflows
        return "a non-finite number"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


def _check_messages(messages: object) -> None:
    """`messages` is an array of message objects whose `content` is text, parts or null.

    Absent or null counts as no prompt (like an absent `prompt`): that the field is required
    is the replica's to say, the router can route it.
    """
    if messages is None:
        return
    if not isinstance(messages, list):
        raise BadRequest(f"'messages' must be an array of message objects, got {_json_type(messages)}", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"'messages[{i}]' must be an object, got {_json_type(m)}", "messages")
        content = m.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list) or not all(isinstance(p, (dict, str)) for p in content):
            raise BadRequest(f"'messages[{i}].content' must be a string, an array of content parts or null", "messages")


def _check_prompt(prompt: object) -> None:
    """`prompt` is absent/null (vLLM's prompt_embeds), text, token ids, or a batch of either.

    Element types are compared with `set(map(type, ...))`: json.loads makes exact types (a
    JSON `true` is `bool`, not `int`), and the scan runs at C speed on long token-id prompts.
    """
    if prompt is None or isinstance(prompt, str):
        return
    if isinstance(prompt, list):
        kinds = set(map(type, prompt))
        if kinds <= {str} or kinds <= {int}:  # an empty list too
            return
        if kinds == {list} and all(set(map(type, p)) <= {int} for p in prompt):
            return
    raise BadRequest(
        "'prompt' must be a string, an array of strings, an array of token ids or an array of token-id arrays",
        "prompt",
    )


def _load_object(body: bytes) -> dict:
    """The body as a JSON object; `BadRequest` for anything else.

    UTF-8 only (RFC 8259 §8.1; a leading BOM is tolerated as before); the recursion error a
    deeply nested body raises in the JSON parser is the client's problem, not a crash.
    """
    try:
        text = body.decode("utf-8")  # strict: no lone surrogates either
    except UnicodeDecodeError as e:
        raise BadRequest(f"request body is not UTF-8: {e}") from None
    if text.startswith("\ufeff"):  # not the utf-8-sig codec: it is the slower one
        text = text[1:]
    try:
        obj = json.loads(text)
    except ValueError as e:  # JSONDecodeError, and int() refusing more than 4300 digits
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequest("request body is not usable JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise BadRequest(f"request body must be a JSON object, got {_json_type(obj)}")
    return obj


def parse_request(body: bytes, chat: bool, chars_per_token: float) -> RequestInfo:
    """Read the routing fields of an OpenAI completions / chat body. Raises `BadRequest`.

    Only the fields routing reads are checked (model, messages or prompt, max_tokens,
    max_completion_tokens, n, stream); the rest is the replica's business.
    """
    obj = _load_object(body)
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"'model' must be a string, got {_json_type(model)}", "model")
    stream = obj.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be a boolean, got {_json_type(stream)}", "stream")
    n = _int_field(obj, "n")
    if chat:
        messages = obj.get("messages")
        _check_messages(messages)
        prompt_tokens = chat_prompt_tokens(messages, chars_per_token)
        n_prompts = 1
        max_tokens = _int_field(obj, "max_completion_tokens")
        max_tokens_field = _int_field(obj, "max_tokens")  # checked even when the other wins
        if max_tokens is None:
            max_tokens = max_tokens_field
    else:
        prompt = obj.get("prompt")
        _check_prompt(prompt)
        prompt_tokens, n_prompts = completion_prompt_tokens(prompt, chars_per_token)
        max_tokens = _int_field(obj, "max_tokens")
    n_seqs = n_prompts * (n if n is not None and n > 0 else 1)
    return RequestInfo(model, prompt_tokens, max_tokens, n_seqs, stream is True)


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
