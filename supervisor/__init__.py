"""Process supervision, the `hermes-sup` command line, and the workspace (hermes.yaml).

`workspace` finds and scaffolds workspaces and reads their config; `spec` turns it into child specs;
`policy` decides restarts (pure); `runner` is the event loop that keeps the agents alive, with
`control` (its sockets and control protocol), `boardwork` (board work off the loop), `ingestwarn`
(its warning about dropped tasks no agent could claim), `statefile`
(supervisor.json, never fatal), `procs` and `cgroups` (which processes are an agent's, and stopping
them all), `sweep` (what a dead supervisor left); `cli` is the command line, `cliargs` checks its
arguments, `render` draws the board and tables (user text literally), `team` reads the team for
"why is it not moving" (kanban/why.py), `usage` and `doctor` are
their commands. May import `kanban` and `agents`.
"""
