"""From a parsed OpenAI request to what the engine takes: an EngineRequest (prompt token ids, SamplingParams, ...).

The API's own rules (fields ember does not implement, fields that contradict each other) are checked here and
raise ApiError naming the field; a value's range and what the engine can run are checked by the engine's types
(SamplingParams, EngineRequest, RequestLimits), whose one rejection `ember.server.common.errors.engine_rejections` maps.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from ember.engine.engine_request import EngineRequest
from ember.engine.lora_request import LoRARequest
from ember.engine.sampling_defaults import SamplingDefaults
from ember.engine.sampling_params import SamplingParams
from ember.engine.structured import SchemaError, StructuredOutput
from ember.server.common.errors import ApiError, engine_rejections, from_validation_error
from ember.server.openai.chat_template import ChatTemplate, RenderRequest, RequestTemplates
from ember.server.openai.prompt_encoding import PromptEncoder
from ember.server.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    ChatRenderFields,
    CompletionRequest,
    PromptInput,
    SamplingFields,
    StructuredOutputsParams,
)
from ember.server.openai.tool_calls import ToolPlan
from ember.tokenizers import chat_template as templates

M = TypeVar("M", bound=BaseModel)


@dataclass
class PreparedPrompt:
    """One prompt ready for the engine: its token ids and, when it was text, the text."""

    token_ids: list[int]
    text: str | None = None


def resolve_model(requested: str | None, served_names: list[str]) -> str:
    """The model id to answer with; 404 when the client names a model this server does not serve."""
    if requested is None or requested in served_names:
        return served_names[0] if requested is None else requested
    raise ApiError(
        f"The model {requested!r} does not exist on this server; it serves {served_names}.",
        status_code=HTTPStatus.NOT_FOUND,
        error_type="not_found_error",
        param="model",
        code="model_not_found",
    )


def _unsupported(param: str, what: str) -> ApiError:
    return ApiError(
        f"Unsupported parameter {param!r}: ember does not support {what}. Remove it from the request.",
        param=param,
        code="unsupported_parameter",
    )


# vLLM's request fields ember does not implement, and what each would ask for.
_UNIMPLEMENTED_EXTRAS = (
    ("use_beam_search", "beam search"),
    ("guided_whitespace_pattern", "a custom whitespace pattern"),
    ("structural_tag", "structural tags"),
    ("logits_processors", "custom logits processors"),
    ("vllm_xargs", "custom logits processors' arguments"),
    ("kv_transfer_params", "disaggregated prefill (KV transfer)"),
    ("mm_processor_kwargs", "multimodal inputs"),
)


def _check_common(request: SamplingFields) -> None:
    if request.stream_options is not None and not request.stream:
        raise ApiError(
            "'stream_options' is only allowed when 'stream' is true.",
            param="stream_options",
            code="invalid_value",
        )
    for name, what in _UNIMPLEMENTED_EXTRAS:
        if getattr(request, name):
            raise _unsupported(name, what)
    if request.prompt_logprobs is not None and request.stream:
        raise ApiError("'prompt_logprobs' is only returned whole: drop 'stream' or 'prompt_logprobs'.",
                       param="prompt_logprobs", code="invalid_value")  # fmt: skip
    check_truncation(request.truncate_prompt_tokens)


def check_truncation(keep: int | None) -> None:
    """`truncate_prompt_tokens` (vLLM's) keeps a prompt's last k >= 1 tokens, or -1: the context window's worth."""
    if keep is not None and keep < 1 and keep != -1:
        raise ApiError("'truncate_prompt_tokens' keeps the prompt's last k tokens: give k >= 1, or -1 for the context window.",
                       param="truncate_prompt_tokens", code="invalid_value")  # fmt: skip


def check_chat_request(request: ChatCompletionRequest) -> None:
    """Reject chat fields ember cannot honour, naming each."""
    _check_common(request)
    if request.functions:
        raise _unsupported("functions", "function calling")
    if request.function_call not in (None, "none"):
        raise _unsupported("function_call", "function calling")
    if request.audio is not None:
        raise _unsupported("audio", "audio output")
    if request.modalities not in (None, ["text"]):
        raise _unsupported("modalities", "modalities other than ['text']")
    if request.prediction is not None:
        raise _unsupported("prediction", "predicted outputs")
    if request.top_logprobs is not None and not request.logprobs:
        raise ApiError(
            "'top_logprobs' requires 'logprobs' to be true.", param="top_logprobs", code="invalid_value"
        )
    both_limits = request.max_tokens is not None and request.max_completion_tokens is not None
    if both_limits and request.max_tokens != request.max_completion_tokens:
        raise ApiError(
            "Set only one of 'max_tokens' and 'max_completion_tokens'.",
            param="max_completion_tokens",
            code="invalid_value",
        )
    check_rendering(request, request.messages)
    for index, message in enumerate(request.messages):  # what the role requires is ChatMessage's own check
        _check_reply_extras(index, message)


def _check_reply_extras(index: int, message: ChatMessage) -> None:
    """Refuse a message whose reply fields beside its text carry something: the template renders text
    and tool calls only, so a refusal, annotations, audio or a legacy function call would be lost silently."""
    for name in ("refusal", "annotations", "audio", "function_call"):
        if getattr(message, name):
            raise ApiError(f"Message {index} ({message.role}) has {name!r}, which ember cannot render; "
                           "send it as content or tool_calls, or leave it null.",
                           param=f"messages.{index}.{name}", code="unsupported_parameter")  # fmt: skip


def check_rendering(request: ChatRenderFields, messages: list[ChatMessage]) -> None:
    """Reject rendering fields that contradict each other or the messages, naming each."""
    last = {"role": messages[-1].role, "content": messages[-1].text()} if messages else None
    try:
        templates.check_rendering(last, bool(request.add_generation_prompt), bool(request.continue_final_message),
                                  request.chat_template_kwargs)  # fmt: skip
    except templates.RenderingError as error:
        param = "chat_template_kwargs" if error.argument == "variables" else error.argument
        raise ApiError(f"Invalid {param}: {error}.", param=param, code="invalid_value") from error


def check_completion_request(request: CompletionRequest) -> None:
    """Reject completion fields ember cannot honour, naming each."""
    _check_common(request)
    if request.suffix:
        raise _unsupported("suffix", "insertion with a suffix")
    if request.best_of is not None and request.best_of != (request.n or 1):
        raise _unsupported("best_of", "best_of other than n")
    if request.max_tokens == 0 and not request.echo:
        raise ApiError("max_tokens=0 generates nothing: it is allowed only with echo (to score the prompt).",
                       param="max_tokens", code="invalid_value")  # fmt: skip


def scores_prompt_only(request: CompletionRequest) -> bool:
    """Whether a completion asks for its prompt back and nothing generated (`echo` with `max_tokens: 0`, as
    OpenAI's legacy API and vLLM take it): how a harness reads a text's log-likelihood."""
    return bool(request.echo) and request.max_tokens == 0


def sampling_params(
    request: SamplingFields,
    defaults: SamplingDefaults,
    max_tokens: int | None,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
    tool_constraint: StructuredOutput | None = None,
    keeps_special_tokens: bool = False,
    names: dict[str, str] | None = None,
) -> SamplingParams:
    """SamplingParams of a request (prompt logprobs: the most asked for, by `prompt_logprobs` or the caller's
    argument), `defaults` where it leaves a field out (OpenAI's: temperature 1, top_p 1, or the
    model's generation config); `max_tokens` None: the default's, else up to the context window; `tool_constraint`
    holds a forced tool call's reply to its JSON (and excludes every other output constraint);
    `keeps_special_tokens` keeps special tokens in the text (where tool-call markers are special tokens); `names`: the
    request's names of SamplingParams' fields where they differ (`param_names`), for the 400 a bad value gets."""
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    asked = [value for value in (prompt_logprobs, request.prompt_logprobs) if value is not None]
    prompt_logprobs = max(asked, default=None)

    def given(value, default):
        return default if value is None else value

    with engine_rejections(names):
        return SamplingParams(
            n=given(request.n, 1),
            max_tokens=given(max_tokens, defaults.max_tokens),
            min_tokens=given(request.min_tokens, 0),
            temperature=given(request.temperature, defaults.temperature),
            top_p=given(request.top_p, defaults.top_p),
            top_k=given(request.top_k, defaults.top_k),
            min_p=given(request.min_p, defaults.min_p),
            seed=request.seed,
            presence_penalty=given(request.presence_penalty, 0.0),
            frequency_penalty=given(request.frequency_penalty, 0.0),
            repetition_penalty=given(request.repetition_penalty, defaults.repetition_penalty),
            stop=stop,
            stop_token_ids=list(request.stop_token_ids or []),
            ignore_eos=given(request.ignore_eos, False),
            include_stop_str_in_output=given(request.include_stop_str_in_output, False),
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            skip_special_tokens=given(request.skip_special_tokens, True) and not keeps_special_tokens,
            logit_bias=_token_biases(request.logit_bias),
            allowed_token_ids=request.allowed_token_ids,
            bad_words=list(request.bad_words or []),
            structured_output=_output_constraint(request, tool_constraint),
        )


def param_names(request: SamplingFields) -> dict[str, str]:
    """Where the request names an engine field otherwise: the prompt is a chat's `messages`, its logprobs count
    `top_logprobs`, its max_tokens `max_completion_tokens` when given that way."""
    if not isinstance(request, ChatCompletionRequest):
        return {}
    names = {"prompt": "messages", "logprobs": "top_logprobs"}
    if request.max_completion_tokens is not None:
        names["max_tokens"] = "max_completion_tokens"
    return names


def engine_request(request_id: str, prompt: PreparedPrompt, params: SamplingParams, fields: SamplingFields | None,
                   lora_request: LoRARequest | None = None) -> EngineRequest:  # fmt: skip
    """The engine's request for one prompt of an API request (`fields`: its priority and cache salt; None: neither;
    `lora_request`: the adapter its `model` names); a field the API adds for the engine is read here."""
    if fields is None:
        return EngineRequest(request_id, prompt.token_ids, params, prompt.text, lora_request=lora_request)
    return EngineRequest(request_id, prompt.token_ids, params, prompt.text, priority=fields.priority or 0,
                         cache_salt=fields.cache_salt, lora_request=lora_request)  # fmt: skip


def _output_constraint(request: SamplingFields, tool_constraint: StructuredOutput | None) -> StructuredOutput | None:
    asked = structured_output(request)
    if tool_constraint is not None and asked is not None:
        raise ApiError("A forced tool call ('required' or a named tool_choice) already holds the reply to JSON; "
                       "drop response_format / guided_json / guided_choice.", param="tool_choice", code="invalid_value")  # fmt: skip
    return tool_constraint or asked


GUIDED_FIELDS = ("response_format", "guided_json", "guided_choice", "guided_regex", "guided_grammar", "structured_outputs",
                 "grammar")


def structured_output(request: SamplingFields) -> StructuredOutput | None:
    """The engine's output constraint from OpenAI's response_format, vLLM's guided_json / guided_choice /
    guided_regex / guided_grammar, vLLM's structured_outputs (its newer spelling of the same), or llama.cpp's
    GBNF `grammar`."""
    given = [name for name in GUIDED_FIELDS if _constrains(name, getattr(request, name))]
    if len(given) > 1:
        raise ApiError(f"Set only one of {given}: each constrains the output on its own.", param=given[1], code="invalid_value")
    if not given:
        return None
    try:
        if given[0] == "guided_choice":
            return StructuredOutput(choice=tuple(request.guided_choice))
        if given[0] == "guided_regex":
            return StructuredOutput(regex=request.guided_regex)
        if given[0] in ("guided_grammar", "grammar"):
            return StructuredOutput(grammar=getattr(request, given[0]))
        if given[0] == "guided_json":
            return StructuredOutput(json_schema=_schema_object(request.guided_json))
        if given[0] == "structured_outputs":
            return _structured_outputs(request.structured_outputs)
        return _response_format(request.response_format)
    except SchemaError as error:
        raise ApiError(f"Invalid {given[0]}: {error}.", param=given[0], code="invalid_value") from error


def _structured_outputs(asked: StructuredOutputsParams) -> StructuredOutput:
    """vLLM's `structured_outputs` object: exactly one of json, regex, choice, json_object, grammar (compact JSON on
    asking)."""
    for name, what in (("structural_tag", "structural tags"), ("whitespace_pattern", "a custom whitespace pattern")):
        if getattr(asked, name) is not None:
            raise _unsupported(f"structured_outputs.{name}", what)
    # StructuredOutput itself refuses none or several of them
    schema = None if asked.json_schema is None else _schema_object(asked.json_schema)
    return StructuredOutput(json_object=bool(asked.json_object), json_schema=schema, choice=asked.choice, regex=asked.regex,
                            grammar=asked.grammar, compact_whitespace=bool(asked.disable_any_whitespace))  # fmt: skip


def _constrains(name: str, value: object) -> bool:
    if name == "response_format":
        return value is not None and value.get("type") not in (None, "text")
    return value is not None


def _schema_object(schema: dict | str) -> dict:
    if isinstance(schema, dict):
        return schema
    try:
        return json.loads(schema)
    except json.JSONDecodeError as error:
        raise SchemaError(f"the schema is not JSON text ({error})") from error


def _response_format(response_format: dict) -> StructuredOutput:
    kind = response_format.get("type")
    if kind == "json_object":
        return StructuredOutput(json_object=True)
    if kind != "json_schema":
        raise ApiError(f"Invalid response_format type {kind!r}: use 'text', 'json_object' or 'json_schema'.",
                       param="response_format", code="invalid_value")  # fmt: skip
    described = response_format.get("json_schema")
    if not isinstance(described, dict) or not isinstance(described.get("schema"), dict):
        raise ApiError("response_format of type 'json_schema' needs 'json_schema': {'name': ..., 'schema': {...}}.",
                       param="response_format.json_schema", code="invalid_value")  # fmt: skip
    return StructuredOutput(json_schema=described["schema"])


def _token_biases(logit_bias: dict[str, float] | None) -> dict[int, float]:
    """OpenAI's logit_bias (token ids as JSON object keys, so strings) with integer ids."""
    biases = {}
    for key, value in (logit_bias or {}).items():
        if not (key.isascii() and key.isdigit()):
            raise ApiError(
                f"Invalid logit_bias key {key!r}: keys are token ids (non-negative integers as strings).",
                param="logit_bias",
                code="invalid_value",
            )
        biases[int(key)] = value
    return biases


def chat_sampling_params(request: ChatCompletionRequest, defaults: SamplingDefaults, tools: ToolPlan | None = None) -> SamplingParams:
    """SamplingParams of a chat request; no max tokens means the default's, else up to the context window."""
    max_tokens = request.max_tokens if request.max_completion_tokens is None else request.max_completion_tokens
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    names = param_names(request)
    if tools is None:
        return sampling_params(request, defaults, max_tokens, logprobs, names=names)
    # Auto mode reads calls from the text, and templates such as Qwen2.5's mark them with special tokens.
    return sampling_params(request, defaults, max_tokens, logprobs, tool_constraint=tools.constraint(),
                           keeps_special_tokens=tools.mode == "auto", names=names)


def completion_sampling_params(request: CompletionRequest, defaults: SamplingDefaults) -> SamplingParams:
    """SamplingParams of a text completion request; an echo with logprobs scores the prompt's tokens too."""
    prompt_logprobs = request.logprobs if request.echo else None
    # The engine generates at least one token; a prompt-only request drops it (ember.server.completions.text).
    max_tokens = 1 if scores_prompt_only(request) else request.max_tokens
    return sampling_params(request, defaults, max_tokens, request.logprobs, prompt_logprobs)


def chat_template_for(request: ChatRenderFields, served: ChatTemplate | None, brought: RequestTemplates) -> ChatTemplate:
    """The template a request renders messages with: the one it brings (where trusted), else the server's; 400 if none."""
    if request.chat_template is not None:
        return brought.get(request.chat_template)
    if served is None:
        raise ApiError(
            "This model has no chat template; use /v1/completions or start the server with a chat template.",
            param="messages",
            code="no_chat_template",
        )
    return served


def render_request(request: ChatRenderFields, tools: list[dict] | None) -> RenderRequest:
    """What the request's fields ask of the rendering (a continued message has no generation prompt)."""
    continues = bool(request.continue_final_message)
    return RenderRequest(add_generation_prompt=not continues and request.add_generation_prompt is not False, tools=tools,
                         continue_final_message=continues, variables=request.chat_template_kwargs or {})  # fmt: skip


async def chat_prompt(request: ChatCompletionRequest, template: ChatTemplate, encoder: PromptEncoder,
                      tools: ToolPlan | None = None) -> PreparedPrompt:
    """The chat messages rendered by `template` and tokenized (in the encoder's worker)."""
    how = render_request(request, None if tools is None else tools.tools)
    # As vLLM: template variables (gpt-oss templates read the effort), unless chat_template_kwargs gives them.
    given = {"reasoning_effort": request.reasoning_effort, "documents": request.documents}
    how = replace(how, variables={**{name: value for name, value in given.items() if value is not None}, **how.variables})
    text = await encoder.render(template, request.messages, how)
    # The template already writes any BOS it wants; adding special tokens again would double it (unless asked).
    keep = request.truncate_prompt_tokens
    ids = await encoder.encode(text, add_special_tokens=bool(request.add_special_tokens), param="messages", truncates=keep is not None)
    return _truncated(PreparedPrompt(ids, text), keep, encoder.max_model_len)


def count_prompts(prompt: PromptInput, max_waiting: int, param: str) -> int:
    """How many prompts (engine requests) a completion's `prompt` or an embedding's `input` carries; a 400 when more
    than the server ever lets wait (`max_waiting`)."""
    count = 1 if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else len(prompt)
    if count > max_waiting:
        raise ApiError(f"Too many prompts in one request ({count}); this server takes at most {max_waiting}. Split the batch.",
                       param=param, code="invalid_value")  # fmt: skip
    return count


async def completion_prompts(request: CompletionRequest, encoder: PromptEncoder) -> list[PreparedPrompt]:
    """Each prompt of a completion request, tokenized (`prepared_prompts`)."""
    return await prepared_prompts(request.prompt, encoder, "prompt", request.add_special_tokens is not False,
                                  request.truncate_prompt_tokens)  # fmt: skip


async def prepared_prompts(prompt: PromptInput, encoder: PromptEncoder, param: str, add_special_tokens: bool,
                           keep: int | None) -> list[PreparedPrompt]:  # fmt: skip
    """Each prompt of `prompt` (text, texts, ids, or lists of ids; `param` names the field), tokenized, and cut to its
    last `keep` tokens where given (vLLM's truncate_prompt_tokens).

    Every text is checked against the context window before any is tokenized (unless it is to be cut), so one huge
    prompt in a batch is refused without tokenizing the others.
    """
    return [_truncated(prepared, keep, encoder.max_model_len)
            for prepared in await _encoded_prompts(prompt, encoder, param, add_special_tokens, keep is not None)]  # fmt: skip


async def _encoded_prompts(prompt: PromptInput, encoder: PromptEncoder, param: str, add_special_tokens: bool,
                           truncates: bool) -> list[PreparedPrompt]:  # fmt: skip
    if isinstance(prompt, str):
        prompt = [prompt]
    if isinstance(prompt[0], int):  # PromptInput's shapes are never empty  # token ids: EngineRequest and the engine's limits check them
        return [PreparedPrompt(list(prompt))]
    if isinstance(prompt[0], list):
        return [PreparedPrompt(list(ids)) for ids in prompt]
    encoded = await encoder.encode_batch(prompt, add_special_tokens=add_special_tokens, param=param, truncates=truncates)
    return [PreparedPrompt(ids, text) for ids, text in zip(encoded, prompt, strict=True)]


def _truncated(prompt: PreparedPrompt, keep: int | None, max_model_len: int) -> PreparedPrompt:
    """The prompt's last `keep` tokens (vLLM's truncate_prompt_tokens; -1: the context window's worth), its text
    dropped once cut (the text no longer matches the ids); the prompt itself when it is no longer than that."""
    if keep is None:
        return prompt
    keep = max_model_len if keep == -1 else keep
    return prompt if len(prompt.token_ids) <= keep else PreparedPrompt(prompt.token_ids[-keep:])


def response_id(prefix: str, request: SamplingFields) -> str:
    """The id a response carries: `prefix-` and the client's request_id (vLLM's), else a random one."""
    return f"{prefix}-{request.request_id or uuid.uuid4().hex}"


def engine_request_id(response: str, request: SamplingFields) -> str:
    """The engine's id for a request answered as `response`: the same (logs and step records name what the client
    saw), with a random suffix where the client chose the id, so two requests reusing one never collide."""
    return response if request.request_id is None else f"{response}-{uuid.uuid4().hex[:8]}"


def parse_request(model_class: type[M], body: bytes) -> M:
    """The request body validated as `model_class`; a 400 naming the first bad field otherwise."""
    try:
        return model_class.model_validate_json(body)
    except ValidationError as error:
        raise from_validation_error(error) from None
