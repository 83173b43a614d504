"""Process supervision, the `hermes-sup` command line, and the workspace (hermes.yaml).

`workspace` finds and scaffolds workspaces and reads their config; `cli` is the command line;
`render` draws the board and tables. May import `kanban` and `agents`.
"""
