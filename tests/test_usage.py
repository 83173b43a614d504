"""Cost from the price table, and `hermes-sup usage` over the agents' LLM-call logs."""

from __future__ import annotations

import json

from click.testing import CliRunner
from hermes_sup.agents.loop import price
from hermes_sup.agents.translate import Usage
from hermes_sup.supervisor.cli import main
from hermes_sup.supervisor.governance.usage import summarize

PRICES = {"claude-x": {"input": 3.0, "output": 15.0, "cached": 0.3}, "cheap": {"input": 0.1, "output": 0.4}}


def test_price_per_million_tokens_with_cached_input():
    assert price(PRICES, "claude-x", Usage(input=1_000_000, output=100_000, cached=800_000)) == 0.6 + 0.24 + 1.5
    assert price(PRICES, "cheap", Usage(input=2_000_000, output=0, cached=1_000_000)) == 0.2
    assert price(PRICES, "mystery-model", Usage(input=10, output=10)) is None, "unpriced, not free"


def test_summarize_per_agent_task_and_provider():
    records = [
        ("w1", {"task": "a", "provider": "cloud", "model": "claude-x", "outcome": "ok", "tokens_in": 100,
                "tokens_out": 10, "tokens_cached": 50, "cost_usd": 0.002}),
        ("w1", {"task": "a", "provider": "cloud", "model": "claude-x", "outcome": "rate_limit", "tokens_in": 0,
                "tokens_out": 0, "cost_usd": 0.0}),
        ("w2", {"task": "b", "provider": "local", "model": "llama", "outcome": "ok", "tokens_in": 300,
                "tokens_out": 30, "cost_usd": None}),
    ]
    summary = summarize(records)
    assert summary["total"] == {"calls": 3, "failed_calls": 1, "tokens_in": 400, "tokens_out": 40,
                                "tokens_cached": 50, "cost_usd": 0.002, "unpriced_calls": 1, "estimated_calls": 0,
                                "tokens_estimated": 0}
    assert summary["agents"]["w1"]["calls"] == 2 and summary["tasks"]["b"]["unpriced_calls"] == 1
    assert set(summary["providers"]) == {"cloud (claude-x)", "local (llama)"}


def test_usage_command_reads_every_agents_log(tmp_path):
    ws = tmp_path / "ws"
    assert CliRunner().invoke(main, ["init", str(ws)]).exit_code == 0
    (ws / "runs" / "w1").mkdir()
    (ws / "runs" / "w1" / "llm_calls.jsonl").write_text(json.dumps(
        {"task": "a", "provider": "cloud", "model": "claude-x", "outcome": "ok", "tokens_in": 1000, "tokens_out": 100,
         "tokens_cached": 0, "cost_usd": 0.0045}) + "\n" + '{"task": "a", "torn')
    result = CliRunner().invoke(main, ["-w", str(ws), "usage", "--json"])
    assert result.exit_code == 0
    document = json.loads(result.stdout)
    assert document["total"]["cost_usd"] == 0.0045 and document["total"]["calls"] == 1
    assert "cut short" in document["notes"][0]
    text = CliRunner().invoke(main, ["-w", str(ws), "usage"]).output
    assert "total: 1 calls" in text and "$0.0045" in text
    empty = tmp_path / "empty"
    CliRunner().invoke(main, ["init", str(empty)])
    assert "no LLM calls yet" in CliRunner().invoke(main, ["-w", str(empty), "usage"]).output


def test_usage_shows_estimated_tokens_as_such_and_counts_failed_calls(tmp_path):
    ws = tmp_path / "ws"
    assert CliRunner().invoke(main, ["init", str(ws)]).exit_code == 0
    (ws / "runs" / "w1").mkdir()
    records = [
        {"task": "a", "provider": "local", "model": "smol", "outcome": "ok", "tokens_in": 1200, "tokens_out": 30,
         "tokens_cached": 0, "cost_usd": None, "estimated": True},
        {"task": "a", "provider": "local", "model": "smol", "outcome": "context_overflow", "tokens_in": 0,
         "tokens_out": 0, "error": "local: error in the stream (context_overflow): Context size has been exceeded."},
        {"task": "b", "provider": "cloud", "model": "claude-x", "outcome": "ok", "tokens_in": 100, "tokens_out": 10,
         "tokens_cached": 0, "cost_usd": 0.0005},
    ]
    (ws / "runs" / "w1" / "llm_calls.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    document = json.loads(CliRunner().invoke(main, ["-w", str(ws), "usage", "--json"]).stdout)
    assert document["total"]["estimated_calls"] == 1 and document["total"]["tokens_estimated"] == 1230
    assert document["total"]["failed_calls"] == 1 and document["total"]["calls"] == 3
    assert document["tasks"]["b"]["estimated_calls"] == 0
    text = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["-w", str(ws), "usage"]).output
    assert "~1,300 tokens in" in text and "~40 out" in text
    assert "~ estimated: 1 calls (1,230 tokens)" in text and "4 characters a token" in text
    assert "~1,200" in text, "the task's row marks its estimated figures"


def test_a_started_call_counts_once_and_as_interrupted_only_when_it_never_ended():
    ok = {"call": "c1", "outcome": "ok", "task": "t", "provider": "p", "model": "m", "tokens_in": 100,
          "tokens_out": 10, "cost_usd": 0.0}
    # b's c1 is another call than a's c1: ids are per agent log
    records = [("a", {"call": "c1", "outcome": "started", "task": "t", "prompt_estimate": 90}), ("a", ok),
               ("a", {"call": "c2", "outcome": "started", "task": "t", "prompt_estimate": 80}),
               ("b", {"call": "c1", "outcome": "started", "task": "t", "prompt_estimate": "lots"})]
    total = summarize(records)["total"]
    assert (total["calls"], total["failed_calls"], total["estimated_calls"]) == (3, 2, 2)
    assert (total["tokens_in"], total["tokens_estimated"], total["tokens_out"]) == (180, 80, 10)


def test_a_model_call_row_of_odd_shape_from_another_host_is_counted_and_breaks_no_summary():
    """The board database's llm rows are written by any host (or anyone with the database): a task
    or a call id that is an object, not text, made `usage` (every host's) fail with a TypeError."""
    from hermes_sup.supervisor.governance.usage import team_records

    rows = [{"agent": "evil", "entry": {"task": {"a": 1}, "outcome": "ok", "tokens_in": 5, "cost_usd": 0.5}},
            {"agent": "evil", "entry": {"task": ["t"], "outcome": "started", "call": {"x": 1},
                                        "prompt_estimate": 7}},
            {"agent": "evil", "entry": {"task": "t2", "outcome": "ok", "call": ["c"], "tokens_in": 1}}]
    records, _notes = team_records([], rows)
    summary = summarize(records)
    assert summary["total"]["calls"] == 3 and summary["total"]["tokens_in"] == 5 + 7 + 1
    assert summary["tasks"]["-"]["calls"] == 2 and summary["tasks"]["t2"]["calls"] == 1
