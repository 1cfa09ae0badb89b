"""What the route handlers of one app share: the `ServingContext` (engine, settings, encoder, gate, metrics, stored
responses) and `generation`, which drives an engine request for HTTP (admission, abort on exit, metrics, log line)."""
