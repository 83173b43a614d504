"""`schema`: hermes.yaml's JSON Schema, for editors (`hermes-sup schema > hermes.schema.json`)."""

from __future__ import annotations

import click

from ..config.schemadoc import json_text
from .common import command


@command("schema")
def schema_command() -> None:
    """Print hermes.yaml's JSON Schema (draft 2020-12), made from the same schema `up` checks it against.

    \b
    hermes-sup schema > hermes.schema.json
    and as hermes.yaml's first line (`init` writes both):
    # yaml-language-server: $schema=./hermes.schema.json
    """
    click.echo(json_text(), nl=False)
