"""HTTP plumbing every route shares, with no OpenAI wire models: errors, admission and drain, body and header limits,
API keys, SSE bodies, metrics and the request log. The floor of ember.server: it imports nothing else of it."""
