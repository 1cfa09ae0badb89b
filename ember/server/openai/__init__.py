"""The OpenAI wire format and its translation: request and response models, chat templates, prompt encoding off the
event loop, tool calls, reasoning, an OpenAI request turned into an EngineRequest and engine outputs turned into
OpenAI objects. No route handler lives here; those sit above, in completions/, embeddings/ and responses/."""
