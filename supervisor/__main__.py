"""`python -m supervisor` is `hermes-sup`."""

from .cli import main

main()
