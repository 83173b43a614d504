"""The bridge from Hermes Agent: a Hermes home (profiles, providers, skills, cron, board) carried into a workspace."""
