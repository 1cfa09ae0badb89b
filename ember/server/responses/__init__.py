"""OpenAI's Responses API (`POST /v1/responses`): its wire models, the conversion of a request into the chat
completion it amounts to, and the handler that answers it through the chat path."""
