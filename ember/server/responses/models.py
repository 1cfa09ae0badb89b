"""The wire format of OpenAI's Responses API (`POST /v1/responses`): the request (validated strictly, as
every request is) and the response object and stream events a client reads back.

A finished response is stored unless the request says `store: false` (`ember.server.serving.response_store`), so a later
request can continue it with `previous_response_id`, and `GET /v1/responses/{id}` reads it back.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ember.server.openai.protocol import FunctionDefinition, StrictModel


class InputText(StrictModel):
    """One text part of an input message: the user's (`input_text`) or, in history, the model's (`output_text`)."""

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class InputMessage(StrictModel):
    """A message of `input`: a role and its text (a string, or text parts)."""

    type: Literal["message"] | None = None
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class FunctionCallItem(StrictModel):
    """A call the model made earlier (history), as a previous response listed it."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(StrictModel):
    """The result of a call, given back to the model."""

    type: Literal["function_call_output"]
    call_id: str
    output: str
    id: str | None = None
    status: str | None = None


class ReasoningItem(StrictModel):
    """Reasoning a previous response listed (history): accepted, and left out of the prompt, as chat templates of
    thinking models drop earlier turns' reasoning."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] = Field(default_factory=list)
    content: list[Any] | None = None
    encrypted_content: str | None = None
    status: str | None = None


InputItem = InputMessage | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


class FunctionTool(FunctionDefinition):
    """`tools[i]`: a function the model may call (the Responses API's flat form: the definition beside its type)."""

    type: Literal["function"]


class NamedFunctionChoice(StrictModel):
    """`tool_choice` naming the one function the reply must call."""

    type: Literal["function"]
    name: str


class TextFormat(StrictModel):
    """`text.format`: plain text, any JSON object, or a value of a JSON schema."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(StrictModel):
    """`text`: the shape of the output text."""

    format: TextFormat | None = None
    verbosity: str | None = None


class ReasoningSettings(StrictModel):
    """`reasoning`: its effort reaches the chat template as chat requests' `reasoning_effort` does; summaries are not
    written (a reasoning item carries the reasoning itself, with --reasoning-parser)."""

    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(StrictModel):
    """`POST /v1/responses`."""

    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = False
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    user: str | None = None
    store: bool | None = None  # None: true, as OpenAI's default
    previous_response_id: str | None = None  # a stored response this one continues: its input and output come first
    # Accepted and ignored: bookkeeping with no effect on generation.
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    truncation: Literal["disabled"] | None = None
    # Features ember does not implement: refused unless absent or a no-op value.
    conversation: Any | None = None
    reasoning: ReasoningSettings | None = None
    include: list[str] | None = None
    background: bool | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    prompt: Any | None = None


# ---- what comes back -------------------------------------------------------------------------


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    """The assistant's text, one output item."""

    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class OutputFunctionCall(BaseModel):
    """A call the model made, one output item; `call_id` is what the result's `function_call_output` names."""

    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputReasoning(BaseModel):
    """A thinking model's reasoning (with --reasoning-parser), one output item before the message."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText]
    status: Literal["in_progress", "completed", "incomplete"]


OutputItem = OutputReasoning | OutputMessage | OutputFunctionCall


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseObject(BaseModel):
    """The response: its output items, status and usage, and the settings it ran with."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    model: str
    output: list[OutputItem]
    error: None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int | None
    temperature: float
    top_p: float
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool
    text: dict[str, Any]
    metadata: dict[str, str]
    store: bool = False
    truncation: Literal["disabled"] = "disabled"
    previous_response_id: str | None = None
    reasoning: None = None
    user: str | None = None
    usage: ResponseUsage | None = None
