"""The table of malformed or out-of-range requests every server must answer with a 4xx error body."""

from __future__ import annotations

from dataclasses import dataclass

import httpx


@dataclass
class BadRequest:
    """One bad request: what is sent and the status and `param` the error must carry."""

    name: str
    method: str
    path: str
    body: object  # dict/list sent as JSON, bytes sent raw, None for no body
    status_code: int = 400
    param: str | None = None
    message_mentions: str | None = None


def send(client: httpx.Client, bad: BadRequest) -> httpx.Response:
    """Send one bad request as its body says (JSON, raw bytes, or none)."""
    if isinstance(bad.body, bytes):
        return client.request(bad.method, bad.path, content=bad.body, headers={"content-type": "application/json"})
    if bad.body is None:
        return client.request(bad.method, bad.path)
    return client.request(bad.method, bad.path, json=bad.body)


def bad_requests(model: str, max_model_len: int) -> list[BadRequest]:
    """At least 40 bad requests against a server serving `model` with this context window."""
    chat = "/v1/chat/completions"
    completions = "/v1/completions"
    hello = [{"role": "user", "content": "Hi"}]

    def chat_with(**fields) -> dict:
        return {"model": model, "messages": hello, "max_tokens": 4, **fields}

    def completion_with(**fields) -> dict:
        return {"model": model, "prompt": "Hi", "max_tokens": 4, **fields}

    too_long_prompt = "hello " * (max_model_len + 10)
    return [
        BadRequest("invalid json", "POST", chat, b'{"model": ', message_mentions="JSON"),
        BadRequest("empty body", "POST", chat, b""),
        BadRequest("body is an array", "POST", chat, [1, 2, 3]),
        BadRequest("messages missing", "POST", chat, {"model": model}, param="messages"),
        BadRequest("messages empty", "POST", chat, {"model": model, "messages": []}, param="messages"),
        BadRequest("messages not a list", "POST", chat, {"model": model, "messages": "Hi"}, param="messages"),
        BadRequest("unknown role", "POST", chat, chat_with(messages=[{"role": "robot", "content": "x"}])),
        BadRequest("content is a number", "POST", chat, chat_with(messages=[{"role": "user", "content": 5}])),
        BadRequest("user message without content", "POST", chat, chat_with(messages=[{"role": "user"}])),
        BadRequest("unknown model", "POST", chat, chat_with(model="gpt-17"), status_code=404, param="model"),
        BadRequest("max_tokens negative", "POST", chat, chat_with(max_tokens=-1), param="max_tokens"),
        BadRequest("max_tokens zero", "POST", chat, chat_with(max_tokens=0), param="max_tokens"),
        BadRequest("max_tokens string", "POST", chat, chat_with(max_tokens="10"), param="max_tokens"),
        BadRequest("max_tokens float", "POST", chat, chat_with(max_tokens=2.5), param="max_tokens"),
        BadRequest("max_tokens absurd", "POST", chat, chat_with(max_tokens=10**9), param="max_tokens"),
        BadRequest("max_tokens cannot fit", "POST", chat, chat_with(max_tokens=max_model_len), param="max_tokens"),
        BadRequest(
            "max_completion_tokens disagrees",
            "POST",
            chat,
            chat_with(max_tokens=4, max_completion_tokens=5),
            param="max_completion_tokens",
        ),
        BadRequest("temperature negative", "POST", chat, chat_with(temperature=-1), param="temperature"),
        BadRequest("temperature absurd", "POST", chat, chat_with(temperature=50), param="temperature"),
        BadRequest("top_p zero", "POST", chat, chat_with(top_p=0), param="top_p"),
        BadRequest("top_p above one", "POST", chat, chat_with(top_p=1.5), param="top_p"),
        BadRequest("top_k below -1", "POST", chat, chat_with(top_k=-5), param="top_k"),
        BadRequest("min_p above one", "POST", chat, chat_with(min_p=2), param="min_p"),
        BadRequest("n zero", "POST", chat, chat_with(n=0), param="n"),
        BadRequest("n absurd", "POST", chat, chat_with(n=100000), param="n"),
        BadRequest("top_logprobs absurd", "POST", chat, chat_with(logprobs=True, top_logprobs=50), param="top_logprobs"),
        BadRequest("top_logprobs without logprobs", "POST", chat, chat_with(top_logprobs=2), param="top_logprobs"),
        BadRequest("logprobs not a bool", "POST", chat, chat_with(logprobs=3), param="logprobs"),
        BadRequest("presence_penalty absurd", "POST", chat, chat_with(presence_penalty=3), param="presence_penalty"),
        BadRequest("frequency_penalty absurd", "POST", chat, chat_with(frequency_penalty=-3), param="frequency_penalty"),
        BadRequest("too many stop strings", "POST", chat, chat_with(stop=[f"s{i}" for i in range(20)])),
        BadRequest("empty stop string", "POST", chat, chat_with(stop=[""])),
        BadRequest("stop not strings", "POST", chat, chat_with(stop=[1, 2]), param="stop"),
        BadRequest("seed too large", "POST", chat, chat_with(seed=2**70), param="seed"),
        BadRequest("stream not a bool", "POST", chat, chat_with(stream="yes"), param="stream"),
        BadRequest("stream_options without stream", "POST", chat, chat_with(stream_options={"include_usage": True})),
        BadRequest("unknown parameter", "POST", chat, chat_with(frobnicate=1), param="frobnicate", message_mentions="frobnicate"),
        BadRequest("tool without a function", "POST", chat, chat_with(tools=[{"type": "function"}]), param="tools.0.function", message_mentions="function"),
        BadRequest("tool_choice without tools", "POST", chat, chat_with(tool_choice="required"), param="tool_choice"),
        BadRequest("tool_choice naming no tool", "POST", chat, chat_with(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice={"type": "function", "function": {"name": "g"}}), param="tool_choice"),
        BadRequest("tool message without its call id", "POST", chat, chat_with(messages=[{"role": "tool", "content": "42"}]), param="messages.0"),
        BadRequest("forced tool call beside response_format", "POST", chat, chat_with(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="required", response_format={"type": "json_object"}), param="tool_choice"),
        BadRequest("logit_bias key not a token id", "POST", chat, chat_with(logit_bias={"hello": 5}), param="logit_bias"),
        BadRequest("logit_bias value absurd", "POST", chat, chat_with(logit_bias={"1": 500}), param="logit_bias"),
        BadRequest("logit_bias id out of vocabulary", "POST", completions, completion_with(logit_bias={str(10**9): 1}), param="logit_bias"),
        BadRequest("response_format of unknown type", "POST", chat, chat_with(response_format={"type": "yaml"}), param="response_format"),
        BadRequest("json_schema without a schema", "POST", chat, chat_with(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), param="response_format.json_schema"),
        BadRequest("json_schema keyword not enforced", "POST", completions, completion_with(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "items": {"type": "object"}, "uniqueItems": True}}}), param="response_format", message_mentions="uniqueItems"),
        BadRequest("two output constraints", "POST", chat, chat_with(response_format={"type": "json_object"}, guided_choice=["a"]), param="guided_choice"),
        BadRequest("guided_json not JSON", "POST", completions, completion_with(guided_json="{not json"), param="guided_json"),
        BadRequest("guided_choice empty", "POST", chat, chat_with(guided_choice=[]), param="guided_choice"),
        BadRequest("structured_outputs grammar that does not parse", "POST", chat, chat_with(structured_outputs={"grammar": 'root ::= "a'}), param="structured_outputs", message_mentions="grammar"),
        BadRequest("guided_grammar that does not parse", "POST", completions, completion_with(guided_grammar="start: undefined_rule"), param="guided_grammar", message_mentions="grammar"),
        BadRequest("llama.cpp grammar that does not parse", "POST", completions, completion_with(grammar="hello world"), param="grammar", message_mentions="grammar"),
        BadRequest("structured_outputs of two kinds", "POST", chat, chat_with(structured_outputs={"regex": "a+", "choice": ["a"]}), param="structured_outputs"),
        BadRequest("structured_outputs of no kind", "POST", completions, completion_with(structured_outputs={"disable_any_whitespace": True}), param="structured_outputs"),
        BadRequest("structured_outputs unknown key", "POST", chat, chat_with(structured_outputs={"ebnf": "x"}), param="structured_outputs.ebnf"),
        BadRequest("structured_outputs beside guided_json", "POST", chat, chat_with(guided_json={"type": "object"}, structured_outputs={"json_object": True}), param="structured_outputs"),
        BadRequest("continue_final_message after a user turn", "POST", chat, chat_with(continue_final_message=True), param="continue_final_message"),
        BadRequest("continue_final_message with a generation prompt", "POST", chat, chat_with(messages=[*hello, {"role": "assistant", "content": "Hel"}], continue_final_message=True, add_generation_prompt=True), param="continue_final_message"),
        BadRequest("chat_template_kwargs setting messages", "POST", chat, chat_with(chat_template_kwargs={"messages": []}), param="chat_template_kwargs"),
        BadRequest("chat_template from an untrusted request", "POST", chat, chat_with(chat_template="{{ messages }}"), param="chat_template", message_mentions="--trust-request-chat-template"),
        BadRequest("guided_regex that does not compile", "POST", completions, completion_with(guided_regex="(a"), param="guided_regex"),
        BadRequest("prompt longer than context", "POST", completions, completion_with(prompt=too_long_prompt), param="prompt"),
        BadRequest("chat longer than context", "POST", chat, chat_with(messages=[{"role": "user", "content": too_long_prompt}]), param="messages"),
        BadRequest("suffix unsupported", "POST", completions, completion_with(suffix="!"), param="suffix", message_mentions="suffix"),
        BadRequest("best_of above n", "POST", completions, completion_with(best_of=3), param="best_of"),
        BadRequest("prompt missing", "POST", completions, {"model": model}, param="prompt"),
        BadRequest("prompt empty list", "POST", completions, completion_with(prompt=[]), param="prompt"),
        BadRequest("prompt empty string", "POST", completions, completion_with(prompt=""), param="prompt"),
        BadRequest("token id out of vocabulary", "POST", completions, completion_with(prompt=[10**9]), param="prompt"),
        BadRequest("negative token id", "POST", completions, completion_with(prompt=[-1])),
        BadRequest("prompt of mixed types", "POST", completions, completion_with(prompt=["a", 1])),
        BadRequest("completion logprobs absurd", "POST", completions, completion_with(logprobs=50), param="logprobs"),
        BadRequest("completion unknown model", "POST", completions, completion_with(model="nope"), status_code=404, param="model"),
        BadRequest("tokenize without input", "POST", "/tokenize", {}),
        BadRequest("tokenize prompt and messages", "POST", "/tokenize", {"prompt": "a", "messages": hello}, param="prompt"),
        BadRequest("detokenize negative id", "POST", "/detokenize", {"tokens": [-4]}),
        BadRequest("detokenize id out of vocabulary", "POST", "/detokenize", {"tokens": [10**9]}, param="tokens"),
        BadRequest("unknown route", "POST", "/v1/engines/davinci/completions", {}, status_code=404),
        BadRequest("wrong method", "GET", chat, None, status_code=405),
    ]
