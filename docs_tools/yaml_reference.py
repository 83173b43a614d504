"""The page of every hermes.yaml key, generated from hermes.yaml's schema (`supervisor/config/schema.py`):
a mkdocs hook (mkdocs.yml `hooks:`) that adds `reference/hermes-yaml-keys.md` to the site at build time;
`python docs_tools/yaml_reference.py` prints the same page."""

from __future__ import annotations

from typing import Any

PAGE = "reference/hermes-yaml-keys.md"


def markdown() -> str:
    from hermes_sup.supervisor.config.schemadoc import markdown as page

    return page()


def on_files(files: Any, config: Any) -> Any:  # mkdocs hook: the page is made at build time, never kept in docs/
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=markdown()))
    return files


if __name__ == "__main__":
    print(markdown(), end="")
