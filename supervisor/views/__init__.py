"""Views of what happened, shared by the command line and the dashboard: text, a task's records, agent rows."""
