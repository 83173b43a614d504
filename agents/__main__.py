"""`python -m hermes_sup.agents run`: the agent process the supervisor starts."""

import sys

from .worker import main

if __name__ == "__main__":
    if sys.argv[1:2] not in (["run"], []):
        print("usage: python -m hermes_sup.agents run", file=sys.stderr)
        sys.exit(2)
    sys.exit(main())
