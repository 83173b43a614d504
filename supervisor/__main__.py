"""`python -m hermes_sup.supervisor` is `hermes-sup`."""

from .cli import main

main()
