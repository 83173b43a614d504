"""The workspace and its hermes.yaml: finding, loading, checking; granted folders, MCP servers, runtimes, doctor."""
