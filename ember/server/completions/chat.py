"""`POST /v1/chat/completions`: render the conversation, generate, answer whole or streamed."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import Response

from ember.engine.outputs import CompletionOutput, RequestOutput
from ember.engine.sampling_params import SamplingParams
from ember.server.common.admission import AdmissionTicket
from ember.server.common.sse import event, model_response, sse_response
from ember.server.openai.engine_requests import (
    chat_prompt,
    chat_sampling_params,
    chat_template_for,
    check_chat_request,
    engine_request_id,
    param_names,
    parse_request,
    resolve_model,
    response_id,
)
from ember.server.openai.formatting import LogprobFormatter, openai_finish_reason, usage_of
from ember.server.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
)
from ember.server.openai.reasoning import ReasoningStream, split_reasoning
from ember.server.openai.tool_calls import (
    ToolCallStream,
    ToolPlan,
    finish_reason_with_calls,
    plan_tools,
)
from ember.server.serving.context import ServingContext
from ember.server.serving.generation import (
    cancel_on_disconnect,
    collect,
    merge_streams,
    tracked_generate,
)


async def create_chat_completion(context: ServingContext, raw_request: Request) -> Response:
    """Validate, admit and run one chat completion request."""
    request = parse_request(ChatCompletionRequest, await raw_request.body())
    model = resolve_model(request.model, context.model_names)
    check_chat_request(request)
    tools = plan_tools(request)
    params = chat_sampling_params(request, context.config.sampling_defaults, tools)
    # Admitted before rendering and tokenizing: a prompt being tokenized waits too.
    ticket = context.admission.admit(1)
    try:
        return await _run_chat(context, raw_request, request, model, params, tools, ticket)
    except BaseException:
        ticket.release()
        raise


@dataclasses.dataclass(frozen=True)
class ReplyFormat:
    """How a chat reply is written: top logprobs per token, tools read from the text, whether reasoning shows,
    logprob tokens as ids, the text echoed before the reply (the last assistant message, with `echo`), and the
    prompt's logprobs."""

    num_top: int = 0
    tools: ToolPlan | None = None
    shows_reasoning: bool = True
    tokens_as_ids: bool = False
    echo: str = ""
    prompt_top: int | None = None  # vLLM's prompt_logprobs: the likeliest ids shown per prompt token (None: none)

    @classmethod
    def of(cls, request: ChatCompletionRequest, tools: ToolPlan | None) -> ReplyFormat:
        last = request.messages[-1]
        return cls(request.top_logprobs or 0, tools, request.include_reasoning is not False,
                   bool(request.return_tokens_as_token_ids), last.text() if request.echo and last.role == "assistant" else "",
                   request.prompt_logprobs)


async def _run_chat(
    context: ServingContext,
    raw_request: Request,
    request: ChatCompletionRequest,
    model: str,
    params: SamplingParams,
    tools: ToolPlan | None,
    ticket: AdmissionTicket,
) -> Response:
    request_id = response_id("chatcmpl", request)
    reply = ReplyFormat.of(request, tools)
    stream = await start_chat(context, request_id, request, params, tools, ticket)
    if request.stream:
        options = request.stream_options
        include_usage = bool(options and options.include_usage)
        continuous_usage = bool(include_usage and options.continuous_usage_stats)
        chunks = _chunks(context, request_id, model, stream, params.n, reply, include_usage, continuous_usage)
        return sse_response(chunks, ticket.release, context.drain)
    try:
        (output,) = await cancel_on_disconnect(context, raw_request, collect([stream], params.n))
    finally:
        ticket.release()
    return model_response(_response(context, request_id, model, output, reply))


async def start_chat(context: ServingContext, request_id: str, request: ChatCompletionRequest, params: SamplingParams,
                     tools: ToolPlan | None, ticket: AdmissionTicket) -> AsyncIterator[RequestOutput]:
    """Render and tokenize the conversation and start generating, once the engine takes it (the deltas; `ticket`
    is released when they end)."""
    template = chat_template_for(request, context.chat_template, context.request_templates)
    prompt = await chat_prompt(request, template, context.encoder, tools)
    return tracked_generate(context, engine_request_id(request_id, request), prompt, params, request, ticket,
                            param_names(request))


def _response(context: ServingContext, request_id: str, model: str, output: RequestOutput, reply: ReplyFormat
              ) -> ChatCompletionResponse:
    formatter = LogprobFormatter(context.tokenizer, reply.tokens_as_ids)
    parser = context.config.reasoning_parser
    choices = []
    for completion in output.outputs:
        reasoning, text = (None, completion.text) if parser is None else split_reasoning(completion.text, parser)
        content, calls = (text, []) if reply.tools is None else reply.tools.read(text)
        choices.append(ChatChoice(
            index=completion.index,
            message=AssistantMessage(content=(content.strip() or None) if calls else reply.echo + content,
                                     tool_calls=calls or None, reasoning_content=reasoning if reply.shows_reasoning else None),
            logprobs=formatter.chat(completion, reply.num_top),
            finish_reason=finish_reason_with_calls(openai_finish_reason(completion.finish_reason), bool(calls)),
        ))  # fmt: skip
    completion_tokens = sum(len(completion.token_ids) for completion in output.outputs)
    return ChatCompletionResponse(id=request_id, model=model, choices=choices, usage=usage_of([output], completion_tokens),
                                  prompt_logprobs=formatter.vllm_prompt(output.prompt_logprobs, reply.prompt_top))


async def _chunks(
    context: ServingContext,
    request_id: str,
    model: str,
    stream: AsyncIterator[RequestOutput],
    n: int,
    reply: ReplyFormat,
    include_usage: bool,
    continuous_usage: bool = False,
) -> AsyncIterator[str]:
    """The SSE events of a streamed chat completion: a role chunk per choice, then one chunk per
    choice per engine step, then (if asked) a usage chunk with no choices. With
    `continuous_usage` every token chunk also carries the usage so far (what a gateway bills
    when the client cuts the stream). With tools, a choice's calls come whole in one chunk before
    its last (`ember.server.openai.tool_calls.ToolCallStream` decides what text is content). With a reasoning parser, a
    choice's thinking comes as `reasoning_content` deltas (left out where reasoning does not show) before its content;
    an echoed message comes as each choice's first content."""
    created = int(time.time())
    formatter = LogprobFormatter(context.tokenizer, reply.tokens_as_ids)
    num_top, tools, shows_reasoning = reply.num_top, reply.tools, reply.shows_reasoning

    def chunk(choices: list[ChatChunkChoice], usage=None) -> str:
        return event(ChatCompletionChunk(id=request_id, created=created, model=model, choices=choices, usage=usage))

    for index in range(n):
        yield chunk([ChatChunkChoice(index=index, delta=DeltaMessage(role="assistant", content=""))])
        if reply.echo:
            yield chunk([ChatChunkChoice(index=index, delta=DeltaMessage(content=reply.echo))])
    completion_tokens = 0
    last: RequestOutput | None = None
    readers = {index: ToolCallStream(tools) for index in range(n)} if tools is not None else {}
    parser = context.config.reasoning_parser
    thoughts = {index: ReasoningStream(parser) for index in range(n)} if parser is not None else {}
    merged = merge_streams([stream])
    try:
        async for _, delta in merged:
            last = delta
            for part in delta.outputs:
                completion_tokens += len(part.token_ids)
                if not part.text and not part.token_ids and part.finish_reason is None:
                    continue
                usage = usage_of([delta], completion_tokens) if continuous_usage else None
                if thoughts:
                    reasoning, part = _reasoning_apart(thoughts[part.index], part)
                    if reasoning and shows_reasoning:
                        delta_message = DeltaMessage(reasoning_content=reasoning)
                        yield chunk([ChatChunkChoice(index=part.index, delta=delta_message,
                                                     logprobs=formatter.chat(part, num_top))], usage)
                        part = dataclasses.replace(part, logprobs=None)
                    if not part.text and part.finish_reason is None:
                        continue
                if readers:
                    for choice in _tool_choices(readers[part.index], part):
                        yield chunk([choice], usage)
                    continue
                choice = ChatChunkChoice(
                    index=part.index,
                    delta=DeltaMessage(content=part.text),
                    logprobs=formatter.chat(part, num_top),
                    finish_reason=openai_finish_reason(part.finish_reason),
                )
                yield chunk([choice], usage)
    finally:
        await merged.aclose()
    if include_usage and last is not None:
        yield chunk([], usage=usage_of([last], completion_tokens))


def _reasoning_apart(stream: ReasoningStream, part: CompletionOutput) -> tuple[str, CompletionOutput]:
    """This step's reasoning text, and the step with only its content text left (the held-back rest once it ends)."""
    reasoning, content = stream.split(part.text, part.finish_reason is not None)
    return reasoning, dataclasses.replace(part, text=content)


def _tool_choices(reader: ToolCallStream, part: CompletionOutput) -> list[ChatChunkChoice]:
    """One streamed choice's chunks for this step under tools: a named call's next arguments; or content it
    may show, and once it has finished the rest of its content, its calls, and its finish reason."""
    if reader.streams_arguments:
        delta = reader.named_call_delta(part.text)
        choices = [ChatChunkChoice(index=part.index, delta=DeltaMessage(tool_calls=[delta]))] if delta else []
        if part.finish_reason is not None:
            reason = finish_reason_with_calls(openai_finish_reason(part.finish_reason), True)
            choices.append(ChatChunkChoice(index=part.index, delta=DeltaMessage(), finish_reason=reason))
        return choices
    content = reader.content(part.text)
    if part.finish_reason is None:
        return [ChatChunkChoice(index=part.index, delta=DeltaMessage(content=content))] if content else []
    rest, calls = reader.finish()
    choices = [ChatChunkChoice(index=part.index, delta=DeltaMessage(content=content + rest))] if content + rest else []
    if calls:
        deltas = [DeltaToolCall(index=i, id=call.id, type="function",
                                function=DeltaFunctionCall(name=call.function.name, arguments=call.function.arguments))
                  for i, call in enumerate(calls)]  # fmt: skip
        choices.append(ChatChunkChoice(index=part.index, delta=DeltaMessage(tool_calls=deltas)))
    reason = finish_reason_with_calls(openai_finish_reason(part.finish_reason), bool(calls))
    choices.append(ChatChunkChoice(index=part.index, delta=DeltaMessage(), finish_reason=reason))
    return choices
