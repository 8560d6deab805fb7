"""The application: the CLI, the JSON-RPC/MCP server, the Python API, the UI, the demo and the
simulated panel, and the wiring they share (the runtime, the tool catalog)."""
