"""The provider layer against the quirks of real OpenAI-compatible servers (llama.cpp, llama-cpp-python,
Ollama, vLLM), each reproduced by the scripted server and met through the real openai/anthropic SDKs:
null content refused, an error inside a stream, a stream without a finish reason, tools dropped
without tool_choice, no usage in streams, and a base_url without /v1."""

from __future__ import annotations

import os

import pytest
from hermes_sup.agents.fallback import RetryPolicy, complete_with_fallback
from hermes_sup.agents.health import ProviderHealth
from hermes_sup.agents.providers import AnthropicProvider, OpenAIProvider, ProviderConfig, ProviderError

from .conftest import init_workspace
from .llm_server import ScriptedLLM, anthropic_reply, openai_reply
from .test_providers import MESSAGES, TOOLS, anthropic_at, openai_at

CONTEXT_EXCEEDED = {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}


def no_sleep(seconds: float) -> None:
    pass


def test_null_content_is_never_sent_so_a_strict_server_takes_every_turn():
    # An empty answer (null content), and an empty text beside tool calls: llama-cpp-python answers
    # both with a 500 validation error, on every retry of a transcript that holds one.
    history = [*MESSAGES, {"role": "assistant", "content": None},
               {"role": "user", "content": "Please answer."},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_0", "type": "function", "function": {"name": "read_file", "arguments": '{}'}}]},
               {"role": "tool", "tool_call_id": "call_0", "content": "AAA"}]
    with ScriptedLLM(quirks=("null_content_500",)) as llm:
        llm.script("openai", openai_reply("a holds AAA"), openai_reply("streamed too"))
        assert openai_at(llm.url).complete(history, TOOLS).message["content"] == "a holds AAA"
        assert openai_at(llm.url, stream=True).complete(history, TOOLS).message["content"] == "streamed too"
        sent = llm.requests[0]["body"]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "user", "assistant", "tool"]
    assert sent[3]["content"] == "" and sent[3]["tool_calls"][0]["id"] == "call_0"


def test_the_scripted_server_refuses_null_content_like_llama_cpp_python():
    with ScriptedLLM(quirks=("null_content_500",)) as llm:
        provider = openai_at(llm.url)
        provider._connect()
        with pytest.raises(Exception, match="validation error"):  # the quirk itself, met without to_openai
            provider._client.post("/chat/completions", cast_to=object, body={
                "model": "m", "messages": [{"role": "assistant", "content": None}]})


def test_context_exceeded_inside_a_stream_is_a_context_overflow_not_a_crash():
    with ScriptedLLM() as llm:
        llm.script("openai", {**openai_reply("I will now write a very long answer"), "stream_error": CONTEXT_EXCEEDED})
        attempts = []
        with pytest.raises(ProviderError) as info:
            complete_with_fallback([openai_at(llm.url, stream=True)], MESSAGES, None, log=attempts.append,
                                   sleep=no_sleep)
    assert info.value.kind == "context_overflow"
    assert "Context size has been exceeded" in str(info.value)
    assert [a.outcome for a in attempts] == ["context_overflow"] and "Context size" in attempts[0].error
    assert len(llm.requests) == 1, "a context overflow is not retried as it is"


@pytest.mark.parametrize(("api", "error", "kind"), [
    ("openai", {"message": "slot unavailable", "type": "server_error"}, "server"),
    ("anthropic", {"type": "overloaded_error", "message": "Overloaded"}, "server"),
    ("anthropic", {"type": "invalid_request_error", "message": "prompt is too long: 9000 tokens"},
     "context_overflow"),
])
def test_errors_inside_a_stream_are_classified_by_their_type(api, error, kind):
    make, reply = {"openai": (openai_at, openai_reply), "anthropic": (anthropic_at, anthropic_reply)}[api]
    with ScriptedLLM() as llm:
        llm.script(api, {**reply("partial answer that goes on"), "stream_error": error})
        with pytest.raises(ProviderError) as info:
            make(llm.url, stream=True).complete(MESSAGES, None)
    assert info.value.kind == kind and error["message"] in str(info.value)


def test_a_server_error_inside_a_stream_is_retried_then_the_next_provider_answers():
    with ScriptedLLM() as llm:
        error = {"message": "slot unavailable", "type": "server_error"}
        llm.script("openai", *[{**openai_reply("cut short by an error"), "stream_error": error}] * 3)
        llm.script("anthropic", anthropic_reply("from the next provider"))
        attempts = []
        result = complete_with_fallback([openai_at(llm.url, "local", stream=True), anthropic_at(llm.url)], MESSAGES,
                                        None, log=attempts.append, sleep=no_sleep)
    assert result.message["content"] == "from the next provider"
    assert [a.outcome for a in attempts] == ["server", "server", "server", "ok"]


def test_an_answer_in_no_api_shape_and_a_provider_bug_are_logged_errors_not_crashes():
    class Broken:
        config = ProviderConfig(name="buggy", kind="openai", model="m")

        def complete(self, messages, tools, **kwargs):
            raise RuntimeError("a bug in a provider")

    with ScriptedLLM() as llm:
        llm.script("openai", {"json": {"choices": [{"message": "not an object"}]}}, openai_reply("fine"))
        attempts = []
        result = complete_with_fallback([Broken(), openai_at(llm.url, "odd")], MESSAGES, None, log=attempts.append,
                                        sleep=no_sleep, policy=RetryPolicy(retries=1))
    assert result.message["content"] == "fine"
    assert [(a.provider, a.outcome) for a in attempts] == [("buggy", "bad_response"), ("buggy", "bad_response"),
                                                           ("odd", "bad_response"), ("odd", "ok")]
    assert "a bug in a provider" in attempts[0].error and "cannot be read" in attempts[2].error


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_stream_without_a_finish_reason_is_truncated_and_retried(api):
    make, reply = {"openai": (openai_at, openai_reply), "anthropic": (anthropic_at, anthropic_reply)}[api]
    with ScriptedLLM() as llm:
        llm.script(api, {**reply("The answer is that the file holds"), "cut": True}, reply("The file holds AAA."))
        attempts = []
        result = complete_with_fallback([make(llm.url, stream=True)], MESSAGES, None, log=attempts.append,
                                        sleep=no_sleep)
    assert result.message["content"] == "The file holds AAA."
    assert [a.outcome for a in attempts] == ["truncated", "ok"]
    assert "without a finish reason" in attempts[0].error


def test_a_stream_that_is_always_cut_fails_with_that_reason():
    with ScriptedLLM() as llm:
        llm.script("openai", *[{**openai_reply("Half of a sent"), "cut": True}] * 3)
        with pytest.raises(ProviderError) as info:
            complete_with_fallback([openai_at(llm.url, "local", stream=True)], MESSAGES, None, sleep=no_sleep)
    assert info.value.kind == "exhausted" and "without a finish reason" in str(info.value)
    assert len(llm.requests) == 3, "bounded: the first attempt and two retries"


@pytest.mark.parametrize("stream", [False, True])
def test_tool_choice_auto_is_sent_so_a_server_that_needs_it_keeps_the_tools(stream):
    with ScriptedLLM(quirks=("tools_need_choice",)) as llm:
        llm.script("openai", openai_reply(tool_calls=[("read_file", {"path": "a"})]), openai_reply("no tools here"))
        provider = openai_at(llm.url, stream=stream)
        completion = provider.complete(MESSAGES, TOOLS)
        provider.complete(MESSAGES, None)
        bodies = [request["body"] for request in llm.requests]
    assert completion.message["tool_calls"][0]["function"]["name"] == "read_file"
    assert bodies[0]["tool_choice"] == "auto" and "tool_choice" not in bodies[1] and "tools" not in bodies[1]
    assert not any(request.get("tools_dropped") for request in llm.requests)


def wrong_path(kind: str, url: str) -> OpenAIProvider | AnthropicProvider:
    """A provider whose base_url misses the server's /v1 (anthropic's SDK adds /v1 itself: a
    base_url with a stray path stands for it)."""
    if kind == "openai":
        return OpenAIProvider(ProviderConfig(name="wrong", kind="openai", model="m", base_url=url, timeout=5))
    return AnthropicProvider(ProviderConfig(name="wrong", kind="anthropic", model="m", base_url=f"{url}/api",
                                            api_key="sk-test-not-real", timeout=5))


def test_a_server_that_refuses_tool_choice_is_asked_again_without_it_from_then_on():
    with ScriptedLLM(quirks=("rejects_tool_choice",)) as llm:
        llm.script("openai", openai_reply(tool_calls=[("read_file", {"path": "a"})]), openai_reply("a holds AAA"))
        provider = openai_at(llm.url)
        first = provider.complete(MESSAGES, TOOLS)
        second = provider.complete(MESSAGES, TOOLS)
        sent = [request["body"].get("tool_choice") for request in llm.requests]
    assert first.message["tool_calls"][0]["function"]["name"] == "read_file"
    assert second.message["content"] == "a holds AAA"
    assert sent == ["auto", None, None], "refused once, then never sent to that server again"


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_base_url_without_v1_is_skipped_like_a_down_provider(api):
    other = "anthropic" if api == "openai" else "openai"
    with ScriptedLLM(quirks=("v1_only",)) as llm:
        llm.script(other, {"openai": openai_reply, "anthropic": anthropic_reply}[other]("from the healthy one"))
        wrong = wrong_path(api, llm.url)
        right = {"openai": openai_at, "anthropic": anthropic_at}[other](llm.url, "right")
        # A clock that stands still: the breaker's 5 s cooldown must not run out before the check
        # below on a loaded machine (it did, at a load of 10 on 2 cores).
        attempts, health = [], ProviderHealth(clock=lambda: 1_000.0)
        result = complete_with_fallback([wrong, right], MESSAGES, None, log=attempts.append, sleep=no_sleep,
                                        health=health)
    assert result.message["content"] == "from the healthy one"
    assert [(a.provider, a.outcome) for a in attempts] == [("wrong", "misconfigured"), ("right", "ok")]
    assert "HTTP 404" in attempts[0].error
    _until, why = health.cooling("wrong")
    assert "base_url" in why and "/v1" in why


def test_every_provider_misconfigured_says_so_with_the_fix():
    with ScriptedLLM(quirks=("v1_only",)) as llm:
        wrong = wrong_path("openai", llm.url)
        with pytest.raises(ProviderError) as info:
            complete_with_fallback([wrong], MESSAGES, None, sleep=no_sleep, health=ProviderHealth())
    assert "misconfigured" in str(info.value) and "/v1" in str(info.value)


def test_a_stream_without_usage_is_estimated_and_marked_so():
    with ScriptedLLM(quirks=("no_stream_usage",)) as llm:
        answer = "The file a holds three letters: AAA. " * 4
        llm.script("openai", openai_reply(answer, prompt=500, completion=40))
        attempts = []
        result = complete_with_fallback([openai_at(llm.url, stream=True)], MESSAGES, TOOLS, log=attempts.append)
    usage = result.usage
    assert usage.estimated and attempts[0].completion.usage.estimated
    assert usage.output == len(f'{{"content": "{answer}"}}') // 4
    assert usage.input > sum(len(m["content"]) for m in MESSAGES) // 4, "the tools are part of the prompt"


def test_usage_the_server_reports_is_not_estimated():
    with ScriptedLLM() as llm:
        llm.script("openai", openai_reply("fine", prompt=500, completion=40))
        result = complete_with_fallback([openai_at(llm.url, stream=True)], MESSAGES, None)
    assert (result.usage.input, result.usage.output, result.usage.estimated) == (500, 40, False)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_model_list_that_is_not_found_is_a_misconfigured_base_url_not_a_reachable_server(kind):
    from hermes_sup.agents.routing import reach, unreachable

    with ScriptedLLM(quirks=("v1_only",)) as llm:
        wrong = wrong_path(kind, llm.url).config
        root = llm.url + ("/v1" if kind == "openai" else "")
        right = ProviderConfig(name="right", kind=kind, model="m", base_url=root)
        assert reach(right) == ("reachable", None)
        state, why = reach(wrong)
        assert unreachable(wrong) is None, "a server answered: it is there"
    assert state == "misconfigured"
    assert why == ("not found (does base_url end in /v1?)" if kind == "openai" else
                   "not found (does base_url stop at the server's root? the anthropic SDK adds /v1 itself)")


def test_doctor_says_a_base_url_without_v1_is_misconfigured(tmp_path):
    import json
    import subprocess

    from .conftest import CLI, ROOT

    with ScriptedLLM(quirks=("v1_only",)) as llm:
        ws = tmp_path / "ws"
        init_workspace(ws)
        (ws / "hermes.yaml").write_text(f"providers:\n  good: {{kind: openai, base_url: '{llm.url}/v1', model: m}}\n"
                                        f"  nov1: {{kind: openai, base_url: '{llm.url}', model: m}}\n"
                                        "agents:\n  - name: a\n")
        result = subprocess.run([*CLI, "-w", str(ws), "doctor", "--json"], capture_output=True, text=True,
                                timeout=60, cwd=ROOT)
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert (checks["provider good"]["level"], checks["provider good"]["detail"][-9:]) == ("ok", "reachable")
    assert checks["provider nov1"]["level"] == "warn"
    assert checks["provider nov1"]["detail"] == (f"openai, model m at {llm.url}: misconfigured: not found "
                                                 "(does base_url end in /v1?)")


def test_doctor_says_when_a_local_server_does_not_tell_its_context_and_how_to_set_it(tmp_path):
    import json
    import subprocess

    from .conftest import CLI, ROOT

    with ScriptedLLM() as silent, ScriptedLLM(context=4096) as telling:
        ws = tmp_path / "ws"
        init_workspace(ws)
        (ws / "hermes.yaml").write_text(
            f"providers:\n  silent: {{kind: openai, base_url: '{silent.url}/v1', model: m}}\n"
            f"  telling: {{kind: openai, base_url: '{telling.url}/v1', model: m}}\n"
            f"  set: {{kind: openai, base_url: '{silent.url}/v1', model: m, context_window: 8192, max_tokens: 900}}\n"
            "agents:\n  - name: a\n")
        result = subprocess.run([*CLI, "-w", str(ws), "doctor", "--json"], capture_output=True, text=True,
                                timeout=60, cwd=ROOT)
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["context silent"]["level"] == "info"
    assert checks["context silent"]["detail"].startswith(
        "the server does not say its context size, so each answer is capped at 1,024 tokens and the conversation "
        "is kept within 128,000 tokens")
    assert "set context_window" in checks["context silent"]["detail"]
    assert "providers: silent:" in checks["context silent"]["detail"]
    assert (checks["context telling"]["level"], checks["context telling"]["detail"]) == (
        "ok", "4,096 tokens, as the server reports it")
    assert "context set" not in checks, "both set in hermes.yaml: nothing to ask the server"


def test_doctor_says_busy_for_a_server_slow_to_list_its_models_and_unreachable_for_a_dead_one(tmp_path):
    # llama-server answers nothing to /v1/models for ~5 s while it evaluates a prompt: it is alive,
    # and doctor must not call it down (neither as a named provider nor as what auto found).
    import json
    import socket
    import subprocess

    from hermes_sup.agents.routing import AUTO_PORTS_ENV

    from .conftest import CLI, ROOT

    with socket.socket() as free:  # a port nothing listens on once this socket is closed
        free.bind(("127.0.0.1", 0))
        dead = free.getsockname()[1]
    with ScriptedLLM(slow_models=6.0) as llm:
        ws = tmp_path / "ws"
        init_workspace(ws)
        (ws / "hermes.yaml").write_text(f"providers:\n  slow: {{kind: openai, base_url: '{llm.url}/v1', model: m}}\n"
                                        f"  dead: {{kind: openai, base_url: 'http://127.0.0.1:{dead}/v1', model: m}}\n"
                                        "agents:\n  - name: a\n")
        result = subprocess.run([*CLI, "-w", str(ws), "doctor", "--json"], capture_output=True, text=True,
                                timeout=60, cwd=ROOT, env={**os.environ, AUTO_PORTS_ENV: str(llm.port)})
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    slow, auto = checks["provider slow"], checks["provider auto"]
    assert slow["level"] == "info" and slow["detail"].startswith(f"openai, model m at {llm.url}/v1: busy: "), slow
    assert "unreachable" not in slow["detail"]
    assert auto["level"] == "info" and f"server at {llm.url}/v1: busy: " in auto["detail"], auto
    assert "model default" not in auto["detail"], "a busy server's model is not known yet: no made-up name"
    assert checks["provider dead"]["level"] == "warn" and ": unreachable (" in checks["provider dead"]["detail"]
