"""Random client bodies against a live router (issue 23, item 5), with hypothesis.

One router and one fake vLLM run for the whole module on an event loop in a thread, so each
hypothesis example is one blocking HTTP request (http.client). Three properties:

- any body (random JSON, routing fields of every type, huge numbers, deep nesting, truncated
  or flipped bytes, random bytes, broken gzip, past the size limit): never a 5xx, and every
  4xx is an OpenAI error object;
- a valid body with one routing field set to any JSON value: 200, 404 (an unserved model) or
  a 400 whose `param` names that field;
- a well-formed body: 200, and the replica received exactly the bytes the client sent.

Derandomized with a fixed example budget, so CI runs the same few hundred bodies every time.
"""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import threading

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from .fake_vllm import FakeVllm
from .util import replica, running_router, table, write_table

MAX_BODY = 64 * 1024  # small, so the padding mutation reaches the 413 path
FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PATHS = ("/v1/completions", "/v1/chat/completions")
ROUTING_FIELDS = ("model", "messages", "prompt", "max_tokens", "max_completion_tokens", "n", "stream")


class LiveRouter:
    """A router over one fake replica, on an event loop of its own thread."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def __enter__(self) -> "LiveRouter":
        self.thread.start()
        self.fake = self.call(FakeVllm("a", max_tokens_cap=4).start())
        path = write_table(self.tmp_path / "routing.json", table([replica("a", self.fake.url)]))
        self._cm = running_router(path, max_body_bytes=MAX_BODY)
        self.router = self.call(self._cm.__aenter__())
        return self

    def __exit__(self, *exc) -> None:
        self.call(self._cm.__aexit__(None, None, None))
        self.call(self.fake.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        c = http.client.HTTPConnection("127.0.0.1", self.router.port)
        try:
            c.request("POST", path, body=body, headers={"Content-Type": "application/json", **headers})
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with LiveRouter(tmp_path_factory.mktemp("fuzz")) as lr:
        yield lr


# -- strategies ------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**53 - 2, max_value=2**80)
    | st.sampled_from([10**400, -(10**400), 0, -1, 2**53, 2**63])
    | st.floats()  # nan and inf too: json.dumps writes NaN / Infinity, which Python's parser reads
    | st.text(max_size=12)
)
# numbers a float cannot hold or JSON cannot carry exactly: where the load estimate overflowed
hostile_numbers = (
    st.integers(min_value=10**300, max_value=10**1000)
    | st.integers(max_value=-(10**300), min_value=-(10**1000))
    | st.sampled_from([2**53, -(2**53), 2**63, 1e308, -1e308, float("inf"), float("nan"), 1.5, -0.0])
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
token_ids = st.lists(st.integers(min_value=0, max_value=200_000), max_size=6)
good_fields = {
    "model": st.just("tiny"),
    "messages": st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "assistant"])},
            optional={"content": st.none() | st.text(max_size=20) | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=10)}), max_size=3)},
        ),
        max_size=3,
    ),
    "prompt": st.none() | st.text(max_size=30) | token_ids | st.lists(st.text(max_size=8), max_size=3) | st.lists(token_ids, max_size=3),
    "max_tokens": st.none() | st.integers(min_value=-2, max_value=2**53 - 1),
    "max_completion_tokens": st.none() | st.integers(min_value=0, max_value=2**53 - 1),
    "n": st.none() | st.integers(min_value=-2, max_value=8) | st.integers(min_value=0, max_value=2**53 - 1),
    "stream": st.none() | st.booleans(),
}
extra_fields = st.dictionaries(st.text(max_size=8).filter(lambda k: k not in ROUTING_FIELDS), json_values, max_size=3)


@st.composite
def valid_bodies(draw) -> tuple[str, bytes]:
    """A body a client may send: routing fields of the right types, anything else beside them."""
    chat = draw(st.booleans())
    names = [f for f in ROUTING_FIELDS if f != ("prompt" if chat else "messages")]
    obj = draw(extra_fields)
    for name in names:
        if (chat and name == "messages") or draw(st.booleans()):
            obj[name] = draw(good_fields[name])
    if draw(st.booleans()):
        obj["stream"] = True  # streams often: the SSE passthrough is the other half of the hot path
    return PATHS[chat], json.dumps(obj).encode()


@st.composite
def one_field_off(draw) -> tuple[str, str, bytes]:
    """A valid body with one routing field set to any JSON value: (path, that field, body)."""
    path, body = draw(valid_bodies())
    obj = json.loads(body)
    field = draw(st.sampled_from(ROUTING_FIELDS))
    obj[field] = draw(hostile_numbers | json_values)
    return path, field, json.dumps(obj).encode()


@st.composite
def any_object(draw) -> tuple[str, bytes]:
    """A JSON object whose routing fields hold a right or a wrong type, at random."""
    obj = draw(extra_fields)
    for name in ROUTING_FIELDS:
        choice = draw(st.integers(0, 2))
        if choice == 1:
            obj[name] = draw(good_fields[name])
        elif choice == 2:
            obj[name] = draw(json_values)
    return draw(st.sampled_from(PATHS)), json.dumps(obj).encode()


@st.composite
def hostile_requests(draw) -> tuple[str, bytes, dict[str, str]]:
    """A path, body bytes and headers: valid-ish JSON, then maybe mangled."""
    any_json = st.tuples(st.sampled_from(PATHS), json_values.map(lambda v: json.dumps(v).encode()))
    path, body = draw(any_object() | any_json | one_field_off().map(lambda t: (t[0], t[2])))
    how = draw(st.sampled_from(["as is", "truncate", "flip", "random", "deep", "pad", "gzip", "bad gzip"]))
    headers: dict[str, str] = {}
    if how == "truncate":
        body = body[: draw(st.integers(0, max(len(body) - 1, 0)))]
    elif how == "flip" and body:
        i = draw(st.integers(0, len(body) - 1))
        body = body[:i] + bytes([draw(st.integers(0, 255))]) + body[i + 1 :]
    elif how == "random":
        body = draw(st.binary(max_size=64))
    elif how == "deep":
        depth = draw(st.integers(1, 200_000))
        open_, close = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
        body = b'{"prompt": ' + open_ * depth + b"1" + close * depth + b"}"
    elif how == "pad":
        body = body[:1] + b" " * draw(st.integers(0, 2 * MAX_BODY)) + body[1:]
    elif how == "gzip":
        body, headers = gzip.compress(body), {"Content-Encoding": "gzip"}
    elif how == "bad gzip":
        body, headers = b"\x1f\x8b" + body, {"Content-Encoding": "gzip"}
    return path, body, headers


# -- properties ------------------------------------------------------------------------------


def assert_error_shape(status: int, raw: bytes) -> None:
    """An OpenAI error object whose code is the HTTP status."""
    body = json.loads(raw)
    err = body["error"]
    assert isinstance(err["message"], str) and isinstance(err["type"], str)
    assert err["param"] is None or isinstance(err["param"], str)
    assert err["code"] == status


@FUZZ
@given(req=hostile_requests())
def test_no_body_gets_a_5xx_and_every_4xx_is_an_openai_error(live, req):
    path, body, headers = req
    status, hd, raw = live.post(path, body, headers)
    event(f"HTTP {status}")  # --hypothesis-show-statistics: which paths the bodies reached
    assert status < 500, raw[:300]
    if status >= 400:
        assert hd["content-type"].startswith("application/json")
        assert_error_shape(status, raw)
        if status in (400, 413):
            assert json.loads(raw)["error"]["type"] == "invalid_request_error"


@FUZZ
@given(req=one_field_off())
def test_a_wrong_routing_field_is_a_400_naming_it(live, req):
    # one field at a time gets the budget that a fully random object spreads over seven
    path, field, body = req
    status, hd, raw = live.post(path, body, {})
    event(f"{field}: HTTP {status}")
    assert status in (200, 400, 404), raw[:300]  # 404: a `model` string that is not served
    if status == 400:
        assert_error_shape(status, raw)
        assert json.loads(raw)["error"]["param"] == field


@FUZZ
@given(req=valid_bodies())
def test_a_valid_body_is_routed_and_passed_on_byte_for_byte(live, req):
    path, body = req
    before = len(live.fake.records)
    status, hd, raw = live.post(path, body, {})
    event("stream" if json.loads(body).get("stream") is True else "whole")
    assert status == 200, raw[:300]
    assert hd["x-hetcompile-replica"] == "a"
    assert len(live.fake.records) == before + 1 and live.fake.records[-1].body == body
    if json.loads(body).get("stream") is True:
        assert hd["content-type"].startswith("text/event-stream") and raw.endswith(b"data: [DONE]\n\n")
