"""Ray-hosted prefill pool behind an OpenAI-compatible HTTP endpoint."""
