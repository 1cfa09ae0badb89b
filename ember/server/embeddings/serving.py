"""`POST /v1/embeddings`: each input's embedding, the model's final hidden state at its last token, L2-normalised.

That is how vLLM's embed task reads a decoder model, and how decoder embedding models (Qwen3-Embedding, gte-Qwen2)
are meant to be read; a chat model's embeddings come out the same way, for what they are worth. Each input is one
engine request that computes its prompt and generates nothing.
"""

from __future__ import annotations

import base64
import struct
import uuid

from fastapi import Request
from fastapi.responses import Response

from ember.engine.outputs import RequestOutput
from ember.engine.sampling_params import embedding_params
from ember.server.common.admission import AdmissionTicket
from ember.server.common.errors import ApiError
from ember.server.common.sse import model_response
from ember.server.openai.engine_requests import (
    check_truncation,
    count_prompts,
    parse_request,
    prepared_prompts,
    resolve_model,
)
from ember.server.openai.protocol import (
    Embedding,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
)
from ember.server.serving.context import ServingContext
from ember.server.serving.generation import cancel_on_disconnect, collect, tracked_generate

EMBED = embedding_params()


async def create_embeddings(context: ServingContext, raw_request: Request) -> Response:
    """Validate, admit and embed every input of one request."""
    request = parse_request(EmbeddingRequest, await raw_request.body())
    model = resolve_model(request.model, context.model_names)
    if model in context.adapters:
        raise ApiError(f"Embeddings run on the base model, not on the LoRA adapter {model!r}; send model "
                       f"{context.model_names[0]!r}.", param="model", code="invalid_value")
    if request.dimensions is not None:
        raise ApiError("Unsupported parameter 'dimensions': ember returns the model's full hidden size (no Matryoshka "
                       "truncation). Remove it from the request.", param="dimensions", code="unsupported_parameter")  # fmt: skip
    check_truncation(request.truncate_prompt_tokens)
    num_inputs = count_prompts(request.input, context.config.max_waiting, "input")
    ticket = context.admission.admit(max(num_inputs, 1))
    try:
        outputs = await _embedded(context, raw_request, request, ticket)
    finally:
        ticket.release()
    data = [Embedding(index=i, embedding=_encoded(output.embedding, request.encoding_format)) for i, output in enumerate(outputs)]
    num_tokens = sum(len(output.prompt_token_ids) for output in outputs)
    return model_response(EmbeddingResponse(data=data, model=model, usage=EmbeddingUsage(prompt_tokens=num_tokens, total_tokens=num_tokens)))


async def _embedded(context: ServingContext, raw_request: Request, request: EmbeddingRequest, ticket: AdmissionTicket
                    ) -> list[RequestOutput]:  # fmt: skip
    """Tokenize, check and run every input (the engine's outputs, in input order)."""
    prompts = await prepared_prompts(request.input, context.encoder, "input", request.add_special_tokens is not False,
                                     request.truncate_prompt_tokens)  # fmt: skip
    request_id = f"embd-{uuid.uuid4().hex}"
    streams = []
    try:  # every input is checked before any is embedded (a stream reaches the engine at its first read)
        for index, prompt in enumerate(prompts):
            streams.append(tracked_generate(context, f"{request_id}-{index}", prompt, EMBED, None, ticket, {"prompt": "input"}))
    except BaseException:
        for stream in streams:
            await stream.aclose()
        raise
    return await cancel_on_disconnect(context, raw_request, collect(streams, 1))


def _encoded(embedding: list[float], encoding_format: str | None) -> list[float] | str:
    """The floats as they are, or (base64) their little-endian float32 bytes in base64."""
    if encoding_format != "base64":
        return embedding
    return base64.b64encode(struct.pack(f"<{len(embedding)}f", *embedding)).decode("ascii")
