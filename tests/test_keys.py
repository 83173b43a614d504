"""Keys from the workspace's .env: parsed as dotenv writes them, only the variables providers name,
the agent's own environment first, and changes seen without a restart."""

from __future__ import annotations

import os

from hermes_sup.agents.keys import KeyFile, parse_env


def test_parse_env_reads_what_dotenv_files_hold():
    text = ("# keys\n\nexport ANTHROPIC_API_KEY=sk-ant-1\nOPENAI_API_KEY = 'sk 2'\nQUOTED=\"a # b\"\n"
            "TRAILING=value # a comment\nnot a line\n=nothing\n")
    assert parse_env(text) == {"ANTHROPIC_API_KEY": "sk-ant-1", "OPENAI_API_KEY": "sk 2", "QUOTED": "a # b",
                               "TRAILING": "value"}


def test_the_key_file_fills_in_only_named_unset_variables_and_follows_changes(tmp_path):
    env = {"OPENAI_API_KEY": "from-the-shell", "PATH": "/bin"}
    path = tmp_path / ".env"
    keys = KeyFile(path, {"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "MY_KEY"}, env)
    assert keys.refresh() is False and env == {"OPENAI_API_KEY": "from-the-shell", "PATH": "/bin"}
    path.write_text("OPENAI_API_KEY=from-the-file\nANTHROPIC_API_KEY=a1\nPATH=/evil\n")
    assert keys.refresh() is True
    assert env == {"OPENAI_API_KEY": "from-the-shell", "PATH": "/bin", "ANTHROPIC_API_KEY": "a1"}
    assert keys.refresh() is False, "an unchanged file is not read again"
    path.write_text("ANTHROPIC_API_KEY=a2\nMY_KEY=m\n")
    os.utime(path, ns=(1, 1))  # a rewrite within one mtime tick still shows by its new stamp
    assert keys.refresh() is True and env["ANTHROPIC_API_KEY"] == "a2" and env["MY_KEY"] == "m"
    path.unlink()
    assert keys.refresh() is True and env == {"OPENAI_API_KEY": "from-the-shell", "PATH": "/bin"}
