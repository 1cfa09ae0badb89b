"""`POST /v1/completions`: one engine request per prompt, answered whole or streamed.

With `echo`, each choice's text starts with its prompt (as sent, or decoded from the ids given),
and with `logprobs` too the prompt's tokens come first in the logprobs, scored by the model
(the first has none): how evaluation harnesses read a text's log-likelihood. `max_tokens: 0` with
`echo` answers the prompt alone (OpenAI's legacy API and vLLM take it so).
"""

from __future__ import annotations

import contextlib
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
    PreparedPrompt,
    check_completion_request,
    completion_prompts,
    completion_sampling_params,
    count_prompts,
    engine_request_id,
    parse_request,
    resolve_model,
    response_id,
    scores_prompt_only,
)
from ember.server.openai.formatting import LogprobFormatter, openai_finish_reason, usage_of
from ember.server.openai.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
from ember.server.serving.context import ServingContext
from ember.server.serving.generation import (
    cancel_on_disconnect,
    collect,
    merge_streams,
    tracked_generate,
)


async def create_completion(context: ServingContext, raw_request: Request) -> Response:
    """Validate, admit and run one text completion request (one or more prompts)."""
    request = parse_request(CompletionRequest, await raw_request.body())
    model = resolve_model(request.model, context.model_names)
    check_completion_request(request)
    params = completion_sampling_params(request, context.config.sampling_defaults)
    num_prompts = count_prompts(request.prompt, context.config.max_waiting, "prompt")
    # Admitted before tokenizing: prompts being tokenized wait too, and count against the limit.
    ticket = context.admission.admit(max(num_prompts, 1))
    try:
        return await _run_completion(context, raw_request, request, model, params, ticket)
    except BaseException:
        ticket.release()
        raise


async def _run_completion(
    context: ServingContext,
    raw_request: Request,
    request: CompletionRequest,
    model: str,
    params: SamplingParams,
    ticket: AdmissionTicket,
) -> Response:
    prompts = await completion_prompts(request, context.encoder)
    request_id = response_id("cmpl", request)
    echoes = [_echo_text(prompt, context) for prompt in prompts] if request.echo else None
    streams = []
    try:  # every prompt is checked before any response starts (a stream reaches the engine at its first read)
        for index, prompt in enumerate(prompts):
            streams.append(tracked_generate(context, engine_request_id(f"{request_id}-{index}", request), prompt, params,
                                            request, ticket))  # fmt: skip
    except BaseException:
        for stream in streams:
            await stream.aclose()
        raise
    written = CompletionFormat(request.logprobs or 0, echoes, bool(request.return_tokens_as_token_ids), request.prompt_logprobs)
    if scores_prompt_only(request):
        streams = [_without_generated_tokens(stream) for stream in streams]
    if request.stream:
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        chunks = _chunks(context, request_id, model, streams, params.n, written, include_usage)
        return sse_response(chunks, ticket.release, context.drain)
    try:
        outputs = await cancel_on_disconnect(context, raw_request, collect(streams, params.n))
    finally:
        ticket.release()
    return model_response(_response(context, request_id, model, outputs, params.n, written))


@dataclasses.dataclass(frozen=True)
class CompletionFormat:
    """How completion choices are written: top logprobs per token, each prompt's echo (None: no echo), logprob tokens
    as ids, and vLLM's prompt logprobs (the likeliest ids shown per prompt token; None: not asked for)."""

    num_top: int
    echoes: list[str] | None
    tokens_as_ids: bool
    prompt_top: int | None


def _response(
    context: ServingContext,
    request_id: str,
    model: str,
    outputs: list[RequestOutput],
    n: int,
    written: CompletionFormat,
) -> CompletionResponse:
    formatter = LogprobFormatter(context.tokenizer, written.tokens_as_ids)
    num_top, echoes = written.num_top, written.echoes
    choices = []
    completion_tokens = 0
    for prompt_index, output in enumerate(outputs):
        echo = "" if echoes is None else echoes[prompt_index]
        # shared by the prompt's choices
        prompt_logprobs = None if echoes is None else _prompt_logprobs(formatter, output, num_top)
        scored_prompt = formatter.vllm_prompt(output.prompt_logprobs, written.prompt_top)
        for completion in output.outputs:
            completion_tokens += len(completion.token_ids)
            choices.append(
                CompletionChoice(
                    index=prompt_index * n + completion.index,
                    text=echo + completion.text,
                    logprobs=_joined(prompt_logprobs, formatter.completion(completion, num_top, len(echo))),
                    finish_reason=openai_finish_reason(completion.finish_reason),
                    prompt_logprobs=scored_prompt,
                )
            )
    return CompletionResponse(
        id=request_id, model=model, choices=choices, usage=usage_of(outputs, completion_tokens)
    )


async def _chunks(
    context: ServingContext,
    request_id: str,
    model: str,
    streams: list[AsyncIterator[RequestOutput]],
    n: int,
    written: CompletionFormat,
    include_usage: bool,
) -> AsyncIterator[str]:
    """The SSE events of a streamed completion: one chunk per choice per engine step (an echo rides on
    each choice's first), then (if asked) a usage chunk with no choices."""
    created = int(time.time())
    formatter = LogprobFormatter(context.tokenizer, written.tokens_as_ids)
    num_top, echoes = written.num_top, written.echoes
    text_offsets: dict[int, int] = {}
    last_outputs: dict[int, RequestOutput] = {}
    completion_tokens = 0
    merged = merge_streams(streams)
    try:
        async for prompt_index, delta in merged:
            last_outputs[prompt_index] = delta
            for part in delta.outputs:
                completion_tokens += len(part.token_ids)
                if not part.text and not part.token_ids and part.finish_reason is None:
                    continue
                index = prompt_index * n + part.index
                echoing = echoes is not None and index not in text_offsets  # this choice's first chunk
                echo = echoes[prompt_index] if echoing else ""
                offset = text_offsets.get(index, len(echo))
                logprobs = formatter.completion(part, num_top, offset)
                choice = CompletionChoice(
                    index=index,
                    text=echo + part.text,
                    logprobs=_joined(_prompt_logprobs(formatter, delta, num_top), logprobs) if echoing else logprobs,
                    finish_reason=openai_finish_reason(part.finish_reason),
                )
                text_offsets[index] = offset + len(part.text)
                yield event(CompletionResponse(id=request_id, created=created, model=model, choices=[choice]))
    finally:
        await merged.aclose()
    if include_usage and last_outputs:
        outputs = [last_outputs[index] for index in sorted(last_outputs)]
        usage = usage_of(outputs, completion_tokens)
        yield event(CompletionResponse(id=request_id, created=created, model=model, choices=[], usage=usage))


async def _without_generated_tokens(stream: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
    """The deltas of a prompt-only request with the one token the engine had to generate taken out: each
    choice is its echo alone, cut by its max_tokens of 0 (`length`), and counts no completion tokens."""
    async with contextlib.aclosing(stream):
        async for delta in stream:
            emptied = [
                CompletionOutput(index=part.index, logprobs=None if part.logprobs is None else [],
                                 finish_reason=part.finish_reason and "length")  # fmt: skip
                for part in delta.outputs
            ]
            yield dataclasses.replace(delta, outputs=emptied)


def _echo_text(prompt: PreparedPrompt, context: ServingContext) -> str:
    """The prompt as the client sent it; token ids decoded."""
    return prompt.text if prompt.text is not None else context.tokenizer.decode(prompt.token_ids)


def _prompt_logprobs(formatter: LogprobFormatter, output: RequestOutput, num_top: int) -> CompletionLogprobs | None:
    """The prompt's token logprobs in the legacy format; None unless they were asked for."""
    if output.prompt_logprobs is None:
        return None
    return formatter.prompt(output.prompt_token_ids, output.prompt_logprobs, num_top)


def _joined(prompt: CompletionLogprobs | None, completion: CompletionLogprobs | None) -> CompletionLogprobs | None:
    """The prompt's token logprobs followed by the completion's (the completion's alone without the prompt's)."""
    if prompt is None or completion is None:
        return completion
    return CompletionLogprobs(
        tokens=prompt.tokens + completion.tokens,
        token_logprobs=prompt.token_logprobs + completion.token_logprobs,
        top_logprobs=prompt.top_logprobs + completion.top_logprobs,
        text_offset=prompt.text_offset + completion.text_offset,
    )
