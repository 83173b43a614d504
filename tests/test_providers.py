"""Providers with the real openai and anthropic SDKs pointed at a scripted server on 127.0.0.1, and
the fallback chain's decisions."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys

import pytest
from hermes_sup.agents.fallback import RetryPolicy, complete_with_fallback, next_step
from hermes_sup.agents.providers import (
    AnthropicProvider,
    OpenAIProvider,
    ProviderConfig,
    ProviderError,
    classify,
    stream_error,
)

from .llm_server import ScriptedLLM, anthropic_reply, error_reply, openai_reply

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
MESSAGES = [{"role": "system", "content": "You are a worker."}, {"role": "user", "content": "What is in a?"}]


@pytest.fixture
def llm():
    with ScriptedLLM() as server:
        yield server


def openai_at(url: str, name: str = "local", timeout: float = 5.0, stream: bool = False) -> OpenAIProvider:
    return OpenAIProvider(ProviderConfig(name=name, kind="openai", model="m", base_url=f"{url}/v1", timeout=timeout,
                                         stream=stream))


def anthropic_at(url: str, name: str = "cloud", timeout: float = 5.0, stream: bool = False) -> AnthropicProvider:
    return AnthropicProvider(ProviderConfig(name=name, kind="anthropic", model="claude-m", base_url=url,
                                            api_key="sk-test-not-real", timeout=timeout, stream=stream))


PROVIDERS = {"openai": (openai_at, openai_reply), "anthropic": (anthropic_at, anthropic_reply)}


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        (429, "Rate limit reached", "rate_limit"), (429, "You exceeded your current quota: insufficient_quota",
                                                     "quota"),
        (402, "", "quota"), (400, "Your credit balance is too low", "quota"), (401, "bad key", "auth"),
        (403, "forbidden", "auth"), (500, "", "server"), (503, "", "server"), (529, "Overloaded", "server"),
        (408, "", "server"), (400, "This model's maximum context length is 8192 tokens", "context_overflow"),
        (400, "prompt is too long: 210000 tokens > 200000 maximum", "context_overflow"),
        (400, "tools[0].name: invalid", "bad_request"), (404, "model not found", "misconfigured"),
        (405, "", "misconfigured"), (500, "Context size has been exceeded.", "server"),
        (400, "the request exceeds the available context size, try increasing it", "context_overflow"),
    ],
)
def test_classify(status, message, kind):
    assert classify(status, message) == kind


@pytest.mark.parametrize(("body", "status", "kind"), [
    ({"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}, 400, "context_overflow"),
    ({"error": {"type": "overloaded_error", "message": "Overloaded"}}, 529, "server"),
    ({"error": {"type": "rate_limit_error", "message": "slow down"}}, 429, "rate_limit"),
    ({"message": "no code, no type"}, 500, "server"),
    ({"code": "context_length_exceeded", "message": "maximum context length is 4096 tokens"}, 400,
     "context_overflow"),
    ("a bare string", 500, "server"),
])
def test_errors_inside_a_stream_are_classified_by_code_or_type(body, status, kind):
    found, text = stream_error(body, default=500)
    said = body if isinstance(body, str) else (body.get("error") or body)["message"]
    assert found == status and classify(found, text) == kind and said in text


def test_classify_transport_failures():
    assert classify(None, "", timeout=True) == "timeout"
    assert classify(None, "refused", connection=True) == "unavailable"


def test_next_step_decisions():
    rng, policy = random.Random(0), RetryPolicy(retries=2, initial=0.5, max_delay=8, max_retry_after=30)
    limited = ProviderError("rate_limit", "x")
    action, delay = next_step(limited, 1, policy, rng)
    assert action == "retry" and 0.25 <= delay <= 0.5
    assert next_step(limited, 3, policy, rng) == ("next", 0.0)
    assert next_step(ProviderError("rate_limit", "x", retry_after=3), 1, policy, rng) == ("retry", 3)
    assert next_step(ProviderError("rate_limit", "x", retry_after=120), 1, policy, rng) == ("next", 0.0)
    for kind in ("timeout", "unavailable", "auth", "quota", "misconfigured"):
        assert next_step(ProviderError(kind, "x"), 1, policy, rng) == ("next", 0.0)
    for kind in ("context_overflow", "bad_request"):
        assert next_step(ProviderError(kind, "x"), 1, policy, rng) == ("raise", 0.0)


def test_openai_tool_call_then_final_answer(llm):
    llm.script("openai", openai_reply(tool_calls=[("read_file", {"path": "a"})], prompt=120, cached=64),
               openai_reply("a holds AAA", prompt=150, completion=5))
    provider = openai_at(llm.url)
    first = provider.complete(MESSAGES, TOOLS)
    assert first.stop == "tool_calls" and first.usage.cached == 64 and first.usage.input == 120
    call = first.message["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"path": "a"}
    follow = [*MESSAGES, first.message, {"role": "tool", "tool_call_id": call["id"], "content": "AAA"}]
    second = provider.complete(follow, TOOLS)
    assert second.stop == "stop" and second.message["content"] == "a holds AAA"
    sent = llm.requests[1]["body"]
    assert sent["messages"][-1] == {"role": "tool", "tool_call_id": call["id"], "content": "AAA"}
    assert sent["tools"] == TOOLS and sent["model"] == "m"


def test_anthropic_request_shape_and_tool_use(llm):
    llm.script("anthropic", anthropic_reply("Looking.", tool_calls=[("read_file", {"path": "a"})], cache_read=900))
    completion = anthropic_at(llm.url).complete(MESSAGES, TOOLS)
    assert completion.stop == "tool_calls" and completion.usage.cached == 900
    assert completion.message["content"] == "Looking."
    request = llm.requests[0]
    assert request["path"] == "/v1/messages"
    body = request["body"]
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert body["tools"][0]["input_schema"]["required"] == ["path"]
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "What is in a?"}]}]
    # anthropic 2.x sends the key as a bearer token, 0.x as x-api-key.
    headers = request["headers"]
    sent_key = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")
    assert sent_key == "sk-test-not-real"


def test_a_429_is_retried_after_its_retry_after_then_succeeds(llm):
    llm.script("openai", error_reply(429, "Rate limit reached", headers={"retry-after": "0.05"}),
               openai_reply("fine"))
    attempts, slept = [], []
    result = complete_with_fallback([openai_at(llm.url)], MESSAGES, None, log=attempts.append, sleep=slept.append)
    assert result.message["content"] == "fine"
    assert [a.outcome for a in attempts] == ["rate_limit", "ok"] and slept == [0.05]


def test_a_provider_that_is_down_falls_back_to_the_next(llm):
    llm.script("anthropic", anthropic_reply("from the fallback"))
    attempts = []
    result = complete_with_fallback([openai_at(closed_port_url(), "down"), anthropic_at(llm.url)], MESSAGES, None,
                                    log=attempts.append)
    assert result.message["content"] == "from the fallback"
    assert [(a.provider, a.outcome) for a in attempts] == [("down", "unavailable"), ("cloud", "ok")]


def test_a_timeout_moves_on_without_retrying(llm):
    llm.script("openai", {"delay": 2.0, **openai_reply("too late")})
    llm.script("anthropic", anthropic_reply("in time"))
    attempts = []
    result = complete_with_fallback([openai_at(llm.url, "slow", timeout=0.3), anthropic_at(llm.url)], MESSAGES, None,
                                    log=attempts.append)
    assert result.message["content"] == "in time"
    assert [a.outcome for a in attempts] == ["timeout", "ok"]


def test_quota_is_not_retried_and_context_overflow_is_raised(llm):
    llm.script("openai", error_reply(429, "You exceeded your current quota", kind="insufficient_quota"))
    llm.script("anthropic", anthropic_reply("other provider"))
    attempts = []
    complete_with_fallback([openai_at(llm.url), anthropic_at(llm.url)], MESSAGES, None, log=attempts.append)
    assert [a.outcome for a in attempts] == ["quota", "ok"]
    llm.script("anthropic", error_reply(400, "prompt is too long: 300000 tokens > 200000 maximum",
                                        kind="invalid_request_error"))
    with pytest.raises(ProviderError) as info:
        complete_with_fallback([anthropic_at(llm.url)], MESSAGES, None)
    assert info.value.kind == "context_overflow"


def test_every_provider_failing_says_so(llm):
    llm.script("openai", error_reply(500), error_reply(500), error_reply(500))
    with pytest.raises(ProviderError) as info:
        complete_with_fallback([openai_at(llm.url, "flaky")], MESSAGES, None, sleep=lambda s: None)
    assert info.value.kind == "exhausted" and "flaky" in str(info.value)
    assert len(llm.requests) == 3, "the first attempt and two retries"


def test_importing_the_provider_layer_imports_no_sdk():
    code = "import sys, hermes_sup.agents.providers; print('openai' in sys.modules, 'anthropic' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_streamed_answer_is_the_same_completion_as_a_plain_one(llm, api):
    make, reply = PROVIDERS[api]
    script = [reply("Reading both files, then I will compare them.", tool_calls=[
        ("read_file", {"path": "a.txt"}), ("read_file", {"path": "notes/b.txt"})], prompt=321, completion=45),
        reply("The files differ in line 3: 'alpha' against 'beta'.", prompt=400, completion=17)]
    llm.script(api, *script, *script)
    plain = [make(llm.url).complete(MESSAGES, TOOLS) for _ in range(2)]
    streamed_provider = make(llm.url, stream=True)
    streamed = [streamed_provider.complete(MESSAGES, TOOLS) for _ in range(2)]
    assert streamed == plain
    assert streamed[0].stop == "tool_calls" and len(streamed[0].message["tool_calls"]) == 2
    assert streamed[0].usage.input == 321 and streamed[0].usage.output == 45
    assert streamed[1].message["content"] == "The files differ in line 3: 'alpha' against 'beta'."
    bodies = [request["body"] for request in llm.requests]
    assert [body.get("stream", False) for body in bodies] == [False, False, True, True]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_stream_that_stalls_times_out_and_the_chain_moves_on(llm, api):
    make, reply = PROVIDERS[api]
    other = "anthropic" if api == "openai" else "openai"
    llm.script(api, {"stall": 2.0, **reply("a long answer that never ends in time")})
    llm.script(other, PROVIDERS[other][1]("from the next provider"))
    attempts = []
    result = complete_with_fallback([make(llm.url, "stalls", timeout=0.3, stream=True), PROVIDERS[other][0](llm.url)],
                                    MESSAGES, None, log=attempts.append)
    assert result.message["content"] == "from the next provider"
    assert [(a.provider, a.outcome) for a in attempts] == [("stalls", "timeout"), (attempts[1].provider, "ok")]


def test_streamed_tool_input_that_is_not_json_reaches_the_loop_as_text(llm):
    reply = anthropic_reply(tool_calls=[("read_file", {"path": "a"})])
    reply["json"]["content"][0]["raw_input"] = '{"path": "a'
    llm.script("anthropic", reply)
    completion = anthropic_at(llm.url, stream=True).complete(MESSAGES, TOOLS)
    arguments = completion.message["tool_calls"][0]["function"]["arguments"]
    assert json.loads(arguments) == '{"path": "a'  # a string, not an object: the loop refuses it
