"""Observability: secret redaction, the ndjson event log (telemetry) and tracing spans."""
