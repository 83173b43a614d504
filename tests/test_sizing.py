"""max_tokens sized from a local server's context window: the pure decision, the parsers of each
server's answer, and the probe against the scripted server as llama-server, Ollama and vLLM."""

from __future__ import annotations

import http.server
import threading

import pytest
from hermes_sup.agents.providers import OpenAIProvider, ProviderConfig
from hermes_sup.agents.routing import provider_configs
from hermes_sup.agents.sizing import (
    CONTEXT_RECHECK,
    MIN_MAX_TOKENS,
    SAFETY,
    UNKNOWN_CONTEXT_MAX_TOKENS,
    context_from_error,
    context_from_models,
    context_from_props,
    context_from_show,
    filled_context,
    probe_context,
    prompt_tokens,
    size_max_tokens,
)
from hermes_sup.agents.translate import to_openai

from .llm_server import ScriptedLLM, openai_reply
from .test_providers import MESSAGES, TOOLS


def test_a_configured_max_tokens_is_kept_whatever_the_context():
    assert size_max_tokens(4096, 3000, 2000) == 2000
    assert size_max_tokens(None, 10, 9000) == 9000


def test_the_answer_may_fill_what_the_prompt_leaves_up_to_the_default():
    assert size_max_tokens(4096, 1500, None) == 4096 - 1500 - SAFETY
    assert size_max_tokens(128_000, 1500, None) == 4096  # a big context: the default caps it
    assert size_max_tokens(4096, 4090, None) == MIN_MAX_TOKENS  # full: the server says so, compression acts
    # Unknown context: a small answer cap, as a 4k server must hold the prompt too.
    assert size_max_tokens(None, 1500, None) == UNKNOWN_CONTEXT_MAX_TOKENS < 4096
    assert size_max_tokens(0, 1500, None, default=1000) == 1000
    assert size_max_tokens(0, 1500, None, default=512) == 512


def test_each_servers_answer_is_read_and_hostile_ones_are_ignored():
    assert context_from_props({"default_generation_settings": {"n_ctx": 4096}}) == 4096
    assert context_from_props({"n_ctx": 2048}) == 2048
    assert context_from_show({"model_info": {"general.architecture": "qwen2", "qwen2.context_length": 32768}}) == 32768
    # Ollama loads a model with the num_ctx of its parameters, not its trained length.
    loaded = {"parameters": "stop \"x\"\nnum_ctx 8192", "model_info": {"a.context_length": 32768}}
    assert context_from_show(loaded) == 8192
    listing = {"data": [{"id": "a", "max_model_len": 1024}, {"id": "b", "max_model_len": 2048}]}
    assert context_from_models(listing, "b") == 2048
    assert context_from_models(listing, "unknown") == 1024
    for hostile in (None, [], "x", {"default_generation_settings": {"n_ctx": "4096"}}, {"n_ctx": True},
                    {"n_ctx": -1}, {"n_ctx": 10 ** 40}, {"default_generation_settings": [1]}):
        assert context_from_props(hostile) is None
    for hostile in (None, {"model_info": []}, {"model_info": {"x.context_length": "big"}}, {"parameters": 7}):
        assert context_from_show(hostile) is None
    for hostile in (None, {"data": "x"}, {"data": [1, {"id": "a", "max_model_len": 0.5}]}):
        assert context_from_models(hostile, "a") is None


@pytest.mark.parametrize("via", ["props", "show", "models"])
def test_a_local_server_is_asked_once_and_each_call_fits_its_context(via):
    with ScriptedLLM(context=4096, context_via=via) as llm:
        llm.script("openai", openai_reply("one"), openai_reply("two"))
        provider = OpenAIProvider(ProviderConfig(name="local", kind="openai", model="m", base_url=f"{llm.url}/v1",
                                                 timeout=5.0, sized=True))
        provider.complete(MESSAGES, TOOLS)
        probes = list(llm.probes)
        provider.complete(MESSAGES, TOOLS)
        assert llm.probes == probes  # cached per provider
    expected = 4096 - prompt_tokens(to_openai(MESSAGES), TOOLS) - SAFETY
    assert [r["body"]["max_tokens"] for r in llm.requests] == [expected, expected]
    assert expected < 4096


def test_a_server_that_tells_nothing_keeps_the_configured_default():
    with ScriptedLLM() as llm:
        llm.script("openai", openai_reply("one"))
        provider = OpenAIProvider(ProviderConfig(name="local", kind="openai", model="m", base_url=f"{llm.url}/v1",
                                                 timeout=5.0, max_tokens=1000, sized=True))
        provider.complete(MESSAGES, None)
    assert llm.requests[-1]["body"]["max_tokens"] == 1000


def test_only_local_servers_without_a_configured_max_tokens_are_sized():
    configs = provider_configs({"providers": {
        "llama": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:8080/v1"},
        "fixed": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:8080/v1", "max_tokens": 512},
        "cloud": {"kind": "openai", "model": "m"},
        "claude": {"kind": "anthropic", "model": "m", "base_url": "http://127.0.0.1:9/"},
    }})
    assert {name: config.sized for name, config in configs.items()} == {
        "llama": True, "fixed": False, "cloud": False, "claude": False}


def test_the_probe_is_bounded_against_an_endless_or_silent_server():
    class Endless(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            try:
                self.wfile.write(b'{"n_ctx": 4096, "pad": "')
                while True:
                    self.wfile.write(b"x" * 65536)
            except OSError:
                pass

        do_POST = do_GET

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert probe_context(f"http://127.0.0.1:{server.server_address[1]}/v1", "m") is None
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_silent_about_its_context_is_asked_again_later_not_every_call():
    with ScriptedLLM() as llm:  # busy, say: it tells nothing at first
        llm.script("openai", openai_reply("one"), openai_reply("two"), openai_reply("three"))
        provider = OpenAIProvider(ProviderConfig(name="local", kind="openai", model="m", base_url=f"{llm.url}/v1",
                                                 timeout=5.0, sized=True))
        provider.complete(MESSAGES, None)
        asked = len(llm.probes)
        llm.context = 1024
        provider.complete(MESSAGES, None)
        assert len(llm.probes) == asked, "not asked before every call"
        provider._context_asked -= CONTEXT_RECHECK  # the wait is over
        provider.complete(MESSAGES, None)
    assert [r["body"]["max_tokens"] for r in llm.requests] == [
        UNKNOWN_CONTEXT_MAX_TOKENS, UNKNOWN_CONTEXT_MAX_TOKENS,
        1024 - prompt_tokens(to_openai(MESSAGES), None) - SAFETY]


def test_compression_keeps_the_conversation_within_the_context_the_server_reports(tmp_path):
    # hermes.yaml names a local llama.cpp without context_window: a 128k default would let the
    # conversation grow until the 4k server refuses it; its own n_ctx is the window instead.
    from hermes_sup.agents.memory import MemoryFile
    from hermes_sup.agents.tools import Toolbox, ToolContext

    from .loops import task_loop
    from .test_loop import CAPS, TASK

    with ScriptedLLM(context=4096) as llm:
        config = {"providers": {"local": {"kind": "openai", "model": "m", "base_url": f"{llm.url}/v1"}}}
        provider = OpenAIProvider(provider_configs(config)["local"])
        scratch = tmp_path / "agent" / "scratch"
        scratch.mkdir(parents=True)
        (scratch / "big.txt").write_text("x" * 12_000)  # ~4,000 tokens: more than 80% of 4,096
        ctx = ToolContext(scratch=scratch, stop=threading.Event(), memory=MemoryFile(tmp_path / "MEMORY.md"))
        loop = task_loop(task=TASK, chain=[provider], workdir=tmp_path / "agent", ctx=ctx,
                         toolbox=Toolbox(grants=CAPS), agent="agent", keep_recent=2)
        llm.script("openai", openai_reply(tool_calls=[("read_file", {"path": "big.txt"})]),
                   openai_reply(tool_calls=[("wait", {"seconds": 0})]),
                   openai_reply("Read a big file full of x."),  # the summarizer's answer
                   openai_reply("All done."))
        outcome = loop.run()
        assert (outcome.kind, outcome.text) == ("done", "All done.")
        assert loop.window() == 4096
    assert llm.requests[2]["body"]["messages"][0]["content"].startswith("Summarize the work")
    assert all("x" * 12_000 not in str(m) for m in llm.requests[3]["body"]["messages"])


def test_a_context_window_set_in_hermes_yaml_wins_over_the_servers_report():
    with ScriptedLLM(context=4096) as llm:
        base = {"kind": "openai", "model": "m", "base_url": f"{llm.url}/v1"}
        configs = provider_configs({"providers": {"set": {**base, "context_window": 100_000}, "told": base,
                                                  "cloud": {"kind": "openai", "model": "m",
                                                            "base_url": "https://api.example.invalid/v1"}}})
        assert OpenAIProvider(configs["set"]).context_window() == 100_000
        assert llm.probes == [], "a window given is not asked for"
        assert OpenAIProvider(configs["told"]).context_window() == 4096
        assert OpenAIProvider(configs["cloud"]).context_window() == 128_000, "a remote API is never probed"


def test_a_server_that_names_its_context_only_in_an_overflow_error_is_fitted_from_then_on():
    # llama-cpp-python answers none of /props, /api/show or max_model_len: its 2k window shows only
    # in the 400 it gives a request that does not fit (the whole 4,096 default asked as max_tokens).
    from hermes_sup.agents.providers import ProviderError

    from .llm_server import error_reply

    assert context_from_error("This model's maximum context length is 4096 tokens. However, you") == 4096
    assert context_from_error("Requested tokens (5000) exceed context window of 2048") == 2048
    assert context_from_error("context length exceeded") is None
    overflow = error_reply(400, "This model's maximum context length is 2048 tokens. However, you requested 4190 "
                                "tokens (94 in the messages, 4096 in the completion).", kind="context_length_exceeded")
    with ScriptedLLM() as llm:
        llm.script("openai", overflow, openai_reply("fits now"))
        config = {"providers": {"local": {"kind": "openai", "model": "m", "base_url": f"{llm.url}/v1"}}}
        provider = OpenAIProvider(provider_configs(config)["local"])
        with pytest.raises(ProviderError) as failed:
            provider.complete(MESSAGES, None)
        assert failed.value.kind == "context_overflow"
        assert provider.complete(MESSAGES, None).message["content"] == "fits now"
        assert provider.context_window() == 2048, "the conversation is compressed to fit it too"
    assert [r["body"]["max_tokens"] for r in llm.requests] == [
        UNKNOWN_CONTEXT_MAX_TOKENS, 2048 - prompt_tokens(to_openai(MESSAGES), None) - SAFETY]


def test_an_answer_that_took_the_whole_context_is_told_apart():
    assert filled_context(1300, 2688, 4096)  # the rambling small model: 4,096 in all
    assert not filled_context(1300, 1024, 4096)
    assert not filled_context(1300, 2688, 0)  # no window known: nothing said
