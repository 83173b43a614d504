"""The agent runtime: the process that claims tasks from the board and works them.

The tool-calling loop, LLM providers, durable state and memory arrive with the runtime issue;
this package holds the agent entry point. May import `kanban`; never `supervisor`.
"""
