"""Request features and workload-class matching."""

from __future__ import annotations

import json

import pytest
from multidict import CIMultiDict

from hetcompile.plan.routing import ClassMatch, HeaderMatch
from hetcompile.router.classify import (
    BadRequest,
    RequestInfo,
    class_matches,
    match_class,
    parse_request,
    predicted_output_tokens,
)


def p(body: dict, chat: bool = False, cpt: float = 4.0) -> RequestInfo:
    return parse_request(json.dumps(body).encode(), chat, cpt)


def test_prompt_tokens_text_ids_batch():
    assert p({"model": "m", "prompt": "x" * 400}).prompt_tokens == 100
    assert p({"model": "m", "prompt": "x" * 400}, cpt=2.0).prompt_tokens == 200
    assert p({"model": "m", "prompt": [5, 6, 7]}).prompt_tokens == 3
    info = p({"model": "m", "prompt": ["x" * 40, "y" * 80], "n": 2})
    assert (info.prompt_tokens, info.n_seqs) == (30, 4)
    assert p({"model": "m", "prompt": [[1, 2], [3, 4, 5]]}).prompt_tokens == 5
    assert p({"model": "m"}).prompt_tokens == 0


def test_chat_prompt_tokens_sum_message_content():
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "s" * 40},
            {"role": "user", "content": [{"type": "text", "text": "u" * 20}, {"type": "image_url", "image_url": {"url": "x"}}]},
            {"role": "assistant", "content": None},
        ],
    }
    assert p(body, chat=True).prompt_tokens == 15


def test_max_tokens_fields():
    assert p({"model": "m", "max_tokens": 7}).max_tokens == 7
    assert p({"model": "m", "max_completion_tokens": 9, "max_tokens": 7}, chat=True).max_tokens == 9
    with pytest.raises(BadRequest, match="'max_tokens' must be an integer"):
        p({"model": "m", "max_tokens": True})  # a bool is not a count
    assert p({"model": "m"}).max_tokens is None


def test_stream_and_model():
    info = p({"model": "llama", "prompt": "hi", "stream": True})
    assert info.model == "llama" and info.stream
    with pytest.raises(BadRequest, match="'stream' must be a boolean"):
        p({"model": "llama", "stream": "yes"})
    assert p({"prompt": "hi"}).model is None


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'{"model": 5}', b"\xff\xfe"])
def test_bad_bodies(body):
    with pytest.raises(BadRequest):
        parse_request(body, False, 4.0)


def test_class_match_bounds_are_half_open():
    m = ClassMatch(prompt_tokens_min=100, prompt_tokens_max=1000)
    h = CIMultiDict()
    assert not class_matches(m, 99, None, h)
    assert class_matches(m, 100, None, h)
    assert class_matches(m, 999.9, None, h)
    assert not class_matches(m, 1000, None, h)


def test_absent_max_tokens_is_unbounded():
    h = CIMultiDict()
    assert class_matches(ClassMatch(max_tokens_min=512), 10, None, h)
    assert not class_matches(ClassMatch(max_tokens_max=512), 10, None, h)
    assert class_matches(ClassMatch(max_tokens_max=512), 10, 511, h)


def test_header_match_is_case_insensitive_on_name():
    m = ClassMatch(header=HeaderMatch(name="X-Workload", value="batch"))
    assert class_matches(m, 1, None, CIMultiDict({"x-workload": "batch"}))
    assert not class_matches(m, 1, None, CIMultiDict({"X-Workload": "Batch"}))
    assert not class_matches(m, 1, None, CIMultiDict())


def test_first_match_wins_and_last_class_catches_the_rest():
    matches = (
        ClassMatch(header=HeaderMatch(name="X-Workload", value="batch")),
        ClassMatch(prompt_tokens_min=1000),
        ClassMatch(max_tokens_max=10),
    )
    info = RequestInfo("m", 5000, None, 1, False)
    assert match_class(matches, info, CIMultiDict({"X-Workload": "batch"})) == 0
    assert match_class(matches, info, CIMultiDict()) == 1
    # nothing matches (short prompt, unbounded max_tokens): the last class is the catch-all
    assert match_class(matches, RequestInfo("m", 5, None, 1, False), CIMultiDict()) == 2


def test_predicted_output_tokens():
    assert predicted_output_tokens(200.0, None) == 200.0
    assert predicted_output_tokens(200.0, 50) == 50.0
    assert predicted_output_tokens(200.0, 500) == 200.0
