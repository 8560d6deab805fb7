"""The worker's inner tool loop: `<tool_call>` tags, hop budget, allowlist, untrusted wrapping."""
