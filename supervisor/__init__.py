"""The process supervisor, with the command line, the dashboard and the workspace around it.

This folder is the supervisor itself: `runner` (the event loop that keeps each agent a live
subprocess) composed of `operator` (the CLI's requests), `watchdog` (heartbeats, memory) and
`leftovers` (adoption, stray sweeps); `exits` and `policy` decide what an exit means and whether to
restart (pure); `spec` turns hermes.yaml into child specs; `control`, `statefile`, `procs`,
`cgroups`, `sessions`, `sweep`, `boardwork`, `ingestwarn`, `supevents` and `steer` are its edges.
Subpackages: `cli/` (the command line), `dashboard/` (the web dashboard), `config/` (the workspace
and hermes.yaml's checks), `governance/` (alerts, schedules, usage and budgets), `hermes/` (carrying
a Hermes Agent home over), `upkeep/` (prune, migrate), `views/` (text and records shared by the
CLI and the dashboard). May import `kanban` and `agents`; they never import it.
"""
