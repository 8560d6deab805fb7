"""The worker's inner tool loop: native calls or `<tool_call>` tags, hop budget, allowlist, wrapping."""
