"""The environment variables an agent process is started with, by the supervisor or by a delegating parent."""

AGENT_ENV = "HERMES_SUP_AGENT"  # the agent's configuration, as JSON
WORKSPACE_ENV = "HERMES_SUP_WORKSPACE"
# The pid of the supervisor that starts the agent (as its child): see Worker._owned.
SUPERVISOR_ENV = "HERMES_SUP_SUPERVISOR_PID"
