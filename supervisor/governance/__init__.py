"""Governance of a running team: alerts, schedules, and the usage and budget views of the LLM-call log."""
