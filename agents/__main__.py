"""`python -m hermes_sup.agents run`: the agent process the supervisor starts."""

import sys

from ..kanban.redact import ScrubbingStream
from .worker import main

if __name__ == "__main__":
    if sys.argv[1:2] not in (["run"], []):
        print("usage: python -m hermes_sup.agents run", file=sys.stderr)
        sys.exit(2)
    # The agent's stdout and stderr are its log file: nothing it prints may carry a key.
    sys.stdout, sys.stderr = ScrubbingStream(sys.stdout), ScrubbingStream(sys.stderr)
    sys.exit(main())
