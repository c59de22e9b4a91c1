"""tinyt.server.schema without a server: each bad field is an ApiError with its status and
param, good fields become the SamplingParams the engine runs with."""
import json

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")

from tinyt.errors import ApiError  # noqa: E402
from tinyt.runtime.sampling import SamplingParams  # noqa: E402
from tinyt.server import schema  # noqa: E402

MODEL = "tiny"


def refused(fn, *args, **kwargs) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn(*args, **kwargs)
    return info.value


@pytest.mark.parametrize("body, param, says", [
    ({"max_tokens": "ten"}, "max_tokens", "'max_tokens' must be an integer >= 1 (0 only with "
                                          "echo), got \"ten\""),
    ({"max_tokens": True}, "max_tokens", "'max_tokens' must be"),  # a bool is not an int
    ({"max_tokens": 0}, "max_tokens", "'max_tokens'=0 is invalid: an integer >= 1"),
    ({"max_completion_tokens": -1}, "max_completion_tokens", "is invalid: an integer >= 1"),
    ({"max_tokens": 30}, "max_tokens", "max_tokens=30 does not fit: the prompt is 5 tokens and "
                                       "the model's context 32, so at most 27 new tokens"),
    ({"temperature": 9}, "temperature", "'temperature'=9 is invalid: a number in [0, 2]"),
    ({"temperature": float("nan")}, "temperature", "'temperature'=NaN is invalid"),
    ({"top_p": 0}, "top_p", "a number in (0, 1]"),
    ({"top_k": 0}, "top_k", "an integer >= 1"),
    ({"seed": -1}, "seed", "an integer >= 0"),
    ({"min_tokens": 1.5}, "min_tokens", "'min_tokens' must be an integer >= 0"),
    ({"repetition_penalty": 100}, "repetition_penalty", "a number in (0, 100)"),
    ({"stop": ["a", ""]}, "stop", "'stop' must be a non-empty string or a list of at most 4"),
    ({"stop": list("abcde")}, "stop", "at most 4"),
    ({"stop": 3}, "stop", "'stop' must be str or list"),
])
def test_a_bad_sampling_field_is_a_400_naming_it(body, param, says):
    e = refused(schema.sampling, body, 5, 32, 16)
    assert (e.status, e.param, e.kind) == (400, param, "invalid_request_error")
    assert says in e.message, e.message


def test_good_fields_become_sampling_params():
    assert schema.sampling({}, 5, 32, 16) == SamplingParams(max_new_tokens=16, temperature=1.0)
    assert schema.sampling({}, 25, 32, 16).max_new_tokens == 7  # the default, cut to the room
    got = schema.sampling({"max_tokens": 8, "temperature": 0, "top_p": 0.9, "top_k": 5,
                           "seed": 3, "stop": "\n", "min_tokens": 2,
                           "repetition_penalty": 1.2, "top_logprobs": None}, 5, 32, 16)
    assert got == SamplingParams(max_new_tokens=8, min_new_tokens=2, temperature=0.0, top_k=5,
                                 top_p=0.9, repetition_penalty=1.2, stop=("\n",), seed=3)
    assert schema.sampling({"max_completion_tokens": 4, "max_tokens": 9}, 5, 32, 16) \
        .max_new_tokens == 4  # the newer name wins
    assert schema.sampling({"max_tokens": None, "stop": ["a", "b"]}, 5, 32, 16).stop == ("a", "b")


@pytest.mark.parametrize("raw, status, param, says", [
    (b"{not json", 400, None, "not valid JSON"),
    (b"\xff", 400, None, "not valid JSON"),
    (b"[1, 2]", 400, None, "must be a JSON object"),
    (b'{"prompt": "x"}', 400, "model", "'model' is required"),
    (b'{"model": 3}', 400, "model", "'model' is required"),
    (b'{"model": "other"}', 404, "model", "model 'other' does not exist; this server serves "
                                          "'tiny'"),
    (b'{"model": "tiny", "suffix": "x", "logit_bias": {"1": 2}}', 400, "logit_bias",
     "does not implement logit_bias, suffix"),
    (b'{"model": "tiny", "colour": 1, "size": 2}', 400, "colour", "unknown field(s) colour, size"),
])
def test_a_bad_body_is_refused_by_name(raw, status, param, says):
    e = refused(schema.parse_body, raw, MODEL)
    assert (e.status, e.param) == (status, param)
    assert says in e.message, e.message


def test_harmless_values_of_unsupported_fields_pass():
    body = {"model": MODEL, "prompt": "x", "n": 1, "echo": False, "logprobs": None,
            "presence_penalty": 0, "user": "u"}
    assert schema.parse_body(json.dumps(body).encode(), MODEL) == body


def test_prompts_and_stream_options():
    assert schema.completion_prompts({"prompt": "a"}, 10) == ["a"]
    assert schema.completion_prompts({"prompt": ["a", "b"]}, 10) == ["a", "b"]
    assert schema.completion_prompts({"prompt": [1, 2]}, 10) == [[1, 2]]  # token ids
    assert schema.completion_prompts({"prompt": [[1, 2], [3]]}, 10) == [[1, 2], [3]]
    assert schema.completion_prompts({"prompt": ["a", [3]]}, 10) == ["a", [3]]
    for bad in (3, [], ["a", 1], None, [[1], []], [True, 1], [[1.5]], [10], [[-1]]):
        e = refused(schema.completion_prompts, {"prompt": bad}, 10)
        assert (e.status, e.param) == (400, "prompt"), bad
    assert schema.check_prompt([1, 2], 32) == [1, 2]
    e = refused(schema.check_prompt, [], 32)
    assert (e.status, e.param, e.message) == (400, "prompt", "the prompt is empty")
    e = refused(schema.check_prompt, [1] * 32, 32)
    assert "the prompt is 32 tokens; this model reads at most 31" in e.message
    assert schema.stream_options({}) == (False, False)
    assert schema.stream_options({"stream": True,
                                  "stream_options": {"include_usage": True}}) == (True, True)
    e = refused(schema.stream_options, {"stream": "yes"})
    assert (e.status, e.param) == (400, "stream")
    e = refused(schema.stream_options, {"stream_options": []})
    assert (e.status, e.param) == (400, "stream_options")


def test_outputs_n_best_of_logprobs_echo():
    o = schema.outputs
    assert o({}, chat=False, stream=False) == schema.Outputs()
    assert o({"n": 3, "best_of": 5, "logprobs": 2, "echo": True}, chat=False, stream=False) == \
        schema.Outputs(n=3, best_of=5, logprobs=2, echo=True)
    assert o({"n": 2}, chat=False, stream=True).best_of == 2  # best_of defaults to n
    assert o({"logprobs": True, "top_logprobs": 4, "n": 2}, chat=True, stream=True) == \
        schema.Outputs(n=2, best_of=2, logprobs=4)
    assert o({"logprobs": True}, chat=True, stream=False).logprobs == 0
    assert o({"logprobs": False}, chat=True, stream=False).logprobs is None
    for body, chat, stream, param, says in [
            ({"n": 0}, False, False, "n", "1..16"), ({"n": 17}, True, False, "n", "1..16"),
            ({"n": True}, False, False, "n", "must be"),
            ({"best_of": 3, "n": 4}, False, False, "best_of", "n (4)..16"),
            ({"best_of": 2}, False, True, "best_of", "cannot stream"),
            ({"logprobs": 6}, False, False, "logprobs", "0..5"),
            ({"logprobs": True}, False, False, "logprobs", "must be"),  # an int here
            ({"logprobs": 2}, True, False, "logprobs", "true or false"),  # a bool in chat
            ({"top_logprobs": 3}, True, False, "top_logprobs", "needs 'logprobs': true"),
            ({"logprobs": True, "top_logprobs": 21}, True, False, "top_logprobs", "0..20"),
            ({"top_logprobs": 1}, False, False, "top_logprobs", "chat completions field"),
            ({"echo": True}, True, False, "echo", "/v1/completions field"),
            ({"best_of": 2}, True, False, "best_of", "/v1/completions field"),
            ({"echo": 1}, False, False, "echo", "true or false")]:
        e = refused(o, body, chat=chat, stream=stream)
        assert (e.status, e.param) == (400, param), body
        assert says in e.message, (body, e.message)


def test_max_tokens_zero_only_with_echo():
    assert schema.sampling({"max_tokens": 0}, 5, 32, 16, echo=True).max_new_tokens == 0
    e = refused(schema.sampling, {"max_tokens": 0}, 5, 32, 16)
    assert e.param == "max_tokens" and "0 only with echo" in e.message
    assert schema.sampling({}, 5, 32, 16, echo=True).max_new_tokens == 16


def test_ignore_eos_asks_for_exactly_max_tokens():
    """vLLM's ignore_eos (guidellm and vLLM's own benchmark send it): end-of-text is never
    chosen, so a request makes max_tokens tokens."""
    p = schema.sampling({"max_tokens": 7, "ignore_eos": True}, 5, 32, 16)
    assert (p.min_new_tokens, p.max_new_tokens) == (7, 7)
    assert schema.sampling({"max_tokens": 7, "ignore_eos": False}, 5, 32, 16).min_new_tokens == 0
    e = refused(schema.sampling, {"ignore_eos": "yes"}, 5, 32, 16)
    assert e.param == "ignore_eos" and "true or false" in e.message
