"""The OpenAI wire format: request models (validated strictly) and response models.

Request models hold types and shapes only: a value's range is checked once, by the engine's own types
(`SamplingParams`, `EngineRequest`, `RequestLimits`), whose rejection the server maps to a 400 naming the field
(`ember.server.common.errors.engine_rejections`). Requests forbid unknown fields, so a parameter ember does not implement
is named in a 400 instead of being silently ignored. Fields that OpenAI defines but ember cannot honour are
declared here and rejected by `ember.server.openai.engine_requests` when set to anything but their no-op value.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

NonNegativeInt = Annotated[int, Field(ge=0)]


class StrictModel(BaseModel):
    """Base of every request model: JSON types are not coerced and unknown fields are errors.

    Optional fields also accept an explicit null (many clients send every field), meaning the default.
    """

    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(StrictModel):
    """`stream_options`: whether the last chunk carries the usage of the whole request."""

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class TextContentPart(StrictModel):
    """One text part of a message whose content is a list of parts."""

    type: Literal["text"]
    text: str


class FunctionCall(StrictModel):
    """A function a tool call names, with its arguments as JSON text."""

    name: str
    arguments: str


class ToolCall(StrictModel):
    """One tool call of an assistant turn (in a request's history, or in a reply)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(StrictModel):
    """A function the model may call: its name, what it does, and its parameters as a JSON schema."""

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(StrictModel):
    """`tools[i]`: a function tool."""

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(StrictModel):
    name: str


class NamedToolChoice(StrictModel):
    """`tool_choice` naming the one function the reply must call."""

    type: Literal["function"]
    function: NamedFunction


# What the role requires of a turn, as the published schema states it (JSON Schema if / then; OpenAPI 3.1).
_ROLE_RULES_SCHEMA = {"allOf": [
    {"if": {"properties": {"role": {"const": "tool"}}, "required": ["role"]},
     "then": {"required": ["tool_call_id"], "properties": {"tool_call_id": {"type": "string", "minLength": 1}}}},
    {"if": {"properties": {"role": {"not": {"const": "assistant"}}}, "required": ["role"]},
     "then": {"required": ["content"], "properties": {"content": {"not": {"type": "null"}},
                                                      "tool_calls": {"anyOf": [{"type": "null"}, {"maxItems": 0}]}}}},
]}


class ChatMessage(StrictModel):
    """One turn of a conversation; `developer` is treated as `system`. An assistant turn may carry the
    tool calls it made (and may have no content), a `tool` turn the result of one (`tool_call_id`);
    every other turn has content and makes no calls."""

    model_config = ConfigDict(json_schema_extra=_ROLE_RULES_SCHEMA)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # An earlier reply's reasoning (--reasoning-parser's reasoning_content, or vLLM's newer name, reasoning), as a
    # client appending the reply to its history sends it back: handed to the chat template, which may show or drop it.
    reasoning_content: str | None = None
    reasoning: str | None = None
    # The rest of a reply as the openai client parses it: a client appending `message.model_dump()` to its
    # history sends them back, null. Accepted empty only (`ember.server.openai.engine_requests` refuses content in them).
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: Any | None = None
    function_call: Any | None = None

    @model_validator(mode="after")
    def _role_rules(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the 'tool_call_id' of the call it answers")
        if self.role != "assistant" and self.tool_calls:
            raise ValueError(f"only assistant messages make tool calls, not {self.role} messages")
        if self.role != "assistant" and self.content is None:
            raise ValueError(f"a {self.role} message needs its content")
        return self

    def text(self) -> str:
        """The message content as one string (text parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StructuredOutputsParams(StrictModel):
    """vLLM's `structured_outputs`: one of json (a schema, or its JSON text), regex, choice, json_object, grammar
    (GBNF / EBNF or Lark); `disable_any_whitespace` asks for compact JSON. `structural_tag` and `whitespace_pattern`
    are declared only to be refused by name."""

    json_schema: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    json_object: bool | None = None
    grammar: str | None = None
    structural_tag: str | None = None
    whitespace_pattern: str | None = None
    disable_any_whitespace: bool | None = False
    # No effect here: ember has no fallback backend, and generates only the properties a schema names.
    disable_fallback: bool | None = False
    disable_additional_properties: bool | None = False


class SamplingFields(StrictModel):
    """Sampling and stopping fields shared by chat and text completions (OpenAI plus vLLM extras)."""

    model: str | None = None
    n: int | None = 1
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = 0
    ignore_eos: bool | None = False
    skip_special_tokens: bool | None = True
    include_stop_str_in_output: bool | None = False
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    # {"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema", "strict"}}
    response_format: dict[str, Any] | None = None
    # vLLM's extensions for the same: a JSON schema (object or its JSON text), or a list of allowed replies.
    guided_json: dict[str, Any] | str | None = None
    guided_choice: list[str] | None = None
    guided_regex: str | None = None
    # vLLM's newer spelling of the guided_* fields.
    structured_outputs: StructuredOutputsParams | None = None
    # vLLM's grammar (GBNF / EBNF or Lark), and llama.cpp server's GBNF `grammar` field: the same constraint.
    guided_grammar: str | None = None
    grammar: str | None = None
    # vLLM's extras: tokens the reply may use or must not spell, the prompt's own logprobs, the prompt cut to its
    # last k tokens (-1: to the context window), logprob tokens written "token_id:<id>", the request's place in the
    # queue (lower first), the id its response takes, a salt its cached prefix is shared under (only with the same).
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = None
    truncate_prompt_tokens: int | None = None
    return_tokens_as_token_ids: bool | None = False
    priority: int | None = 0
    request_id: str | None = Field(default=None, min_length=1, max_length=256)
    cache_salt: str | None = None
    # Accepted, no effect: ember decodes as Hugging Face's fast tokenizers do, where vLLM's option changes nothing
    # either; a length penalty only weighs beams, and the backend for guided outputs is the server's
    # --structured-outputs-backend.
    spaces_between_special_tokens: bool | None = True
    length_penalty: float | None = 1.0
    guided_decoding_backend: str | None = None
    # vLLM's extras ember does not implement: refused by name unless absent or a no-op value.
    use_beam_search: bool | None = False
    guided_whitespace_pattern: str | None = None
    structural_tag: str | None = None
    logits_processors: list[Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    # Accepted and ignored: bookkeeping fields with no effect on generation (safety_identifier and prompt_cache_key:
    # OpenAI's newer fields in place of `user`, as the Responses API request takes them).
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None


class ChatRenderFields(StrictModel):
    """How chat messages are rendered (chat completions and /tokenize): end with the assistant header
    (default), or (vLLM's extras) go on writing the last assistant message; more variables for the
    template (such as enable_thinking); a Jinja template to use instead of the model's."""

    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = False
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None


class ChatCompletionRequest(SamplingFields, ChatRenderFields):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    include_reasoning: bool | None = True  # vLLM's: False leaves reasoning_content out (with --reasoning-parser)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None  # a template variable, as vLLM's
    # vLLM's: documents for retrieval-augmented templates (a template variable), special tokens added to the rendered
    # prompt (the template writes its own, so off by default), the last message written before the reply when both
    # are the assistant's (with continue_final_message).
    documents: list[dict[str, str]] | None = None
    add_special_tokens: bool | None = False
    echo: bool | None = False
    # OpenAI features ember does not implement; rejected unless absent or a no-op value.
    functions: list[Any] | None = None
    function_call: Any | None = None
    audio: Any | None = None
    modalities: list[str] | None = None
    prediction: Any | None = None


# Every shape non-empty: a prompt of nothing has no position to generate from.
_Text = Annotated[str, Field(min_length=1)]
_TokenIds = Annotated[list[int], Field(min_length=1)]
PromptInput = _Text | Annotated[list[_Text], Field(min_length=1)] | _TokenIds | Annotated[list[_TokenIds], Field(min_length=1)]


class CompletionRequest(SamplingFields):
    """`POST /v1/completions`; `prompt` is text, texts, token ids or lists of token ids."""

    prompt: PromptInput
    max_tokens: int | None = 16  # 0 only with echo: the prompt scored, nothing generated
    logprobs: int | None = None
    echo: bool | None = False
    add_special_tokens: bool | None = True
    suffix: str | None = None
    best_of: int | None = None


class EmbeddingRequest(StrictModel):
    """`POST /v1/embeddings`: texts or token ids, each answered with its last-token embedding (vLLM's embed task on a
    decoder model); `encoding_format` base64 packs the floats as little-endian float32, as OpenAI's does."""

    model: str | None = None
    input: PromptInput
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: int | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = None
    add_special_tokens: bool | None = True


class TokenizeRequest(ChatRenderFields):
    """`POST /tokenize`: a text prompt, or chat messages rendered through the chat template (as a chat
    completion renders them; `tools` as the template is given them)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[ToolDefinition] | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(StrictModel):
    """`POST /detokenize`."""

    model: str | None = None
    tokens: list[NonNegativeInt]


# ---- responses -------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    """How many prompt tokens came from the prefix cache."""

    cached_tokens: int = 0


class Usage(BaseModel):
    """Token counts of one request (all of its `n` completions)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class TopLogprob(BaseModel):
    """One alternative token at a position (chat format)."""

    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    """The sampled token at a position with its top alternatives (chat format)."""

    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    """`choices[i].logprobs` of a chat completion."""

    content: list[TokenLogprob] | None


class CompletionLogprobs(BaseModel):
    """`choices[i].logprobs` of a text completion (the legacy format)."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class AssistantMessage(BaseModel):
    """The generated turn of a chat completion: text, or the tools it calls (then `content` may be null)."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None  # a thinking model's reasoning, with --reasoning-parser (vLLM's field)

    @model_serializer(mode="wrap")
    def _drop_absent_fields(self, handler):
        optional = ("tool_calls", "reasoning_content")
        return {key: value for key, value in handler(self).items() if key not in optional or value is not None}


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """A streamed tool call: its first chunk names it (`id`, `type`, `function.name`), the arguments follow."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler):
        data = handler(self)
        data["function"] = {key: value for key, value in data["function"].items() if value is not None}
        return {key: value for key, value in data.items() if value is not None}


class ChatChoice(BaseModel):
    """One completion of a chat request."""

    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None


class PromptLogprob(BaseModel):
    """vLLM's `prompt_logprobs` entry for one token id at one prompt position."""

    logprob: float
    rank: int | None
    decoded_token: str


# One per prompt token: None for the first (nothing came before it), else the token's own entry and the likeliest
# others, keyed by token id (vLLM's format).
PromptLogprobs = list[dict[str, PromptLogprob] | None]


class ChatCompletionResponse(BaseModel):
    """Body of a non-streamed chat completion (`prompt_logprobs` only when asked for)."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: PromptLogprobs | None = None

    @model_serializer(mode="wrap")
    def _drop_absent_prompt_logprobs(self, handler):
        return {key: value for key, value in handler(self).items() if key != "prompt_logprobs" or value is not None}


class DeltaMessage(BaseModel):
    """What a streamed chat chunk adds to its choice; unset fields are left out, as OpenAI does."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None
    reasoning_content: str | None = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler):
        return {key: value for key, value in handler(self).items() if value is not None}


class ChatChunkChoice(BaseModel):
    """One choice's part of a streamed chat chunk."""

    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    """One SSE event of a streamed chat completion."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    """One completion of a text request (also the streamed chunk's choice); `prompt_logprobs` only when asked for."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None
    prompt_logprobs: PromptLogprobs | None = None

    @model_serializer(mode="wrap")
    def _drop_absent_prompt_logprobs(self, handler):
        return {key: value for key, value in handler(self).items() if key != "prompt_logprobs" or value is not None}


class CompletionResponse(BaseModel):
    """Body of a text completion, and of each of its streamed chunks."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    """One entry of `GET /v1/models`; a LoRA adapter's names its base model as `parent` (vLLM's fields)."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "ember"
    max_model_len: int
    root: str | None = None
    parent: str | None = None


class LoadLoRAAdapterRequest(StrictModel):
    """Body of `POST /v1/load_lora_adapter` (vLLM's): the name clients will send as `model`, and the adapter's folder."""

    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(StrictModel):
    """Body of `POST /v1/unload_lora_adapter` (vLLM's)."""

    lora_name: str


class ModelList(BaseModel):
    """Body of `GET /v1/models`."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class Embedding(BaseModel):
    """One input's embedding: floats, or their float32 bytes in base64."""

    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    """Body of `POST /v1/embeddings`."""

    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class TokenizeResponse(BaseModel):
    """Body of `POST /tokenize`."""

    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeResponse(BaseModel):
    """Body of `POST /detokenize`."""

    prompt: str


class ErrorDetail(BaseModel):
    """What went wrong: a message saying what to change, a type, the field (if any) and a code."""

    message: str
    type: str
    param: str | None
    code: str


class ErrorResponse(BaseModel):
    """Body of every 4xx and 5xx answer, as OpenAI's API writes it."""

    error: ErrorDetail
