"""`POST /v1/responses`: OpenAI's Responses API over the chat path, answered whole or as its stream of
typed events (response.created ... response.output_text.delta ... response.completed)."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from http import HTTPStatus

from fastapi import Request
from fastapi.responses import Response

from ember.engine.outputs import RequestOutput
from ember.engine.sampling_params import SamplingParams
from ember.server.common.errors import ApiError
from ember.server.common.sse import model_response, sse_response
from ember.server.completions.chat import start_chat
from ember.server.openai.engine_requests import (
    chat_sampling_params,
    check_chat_request,
    parse_request,
    resolve_model,
)
from ember.server.openai.protocol import ToolCall
from ember.server.openai.reasoning import ReasoningStream, split_reasoning
from ember.server.openai.tool_calls import ToolCallStream, ToolPlan, plan_tools
from ember.server.responses.conversion import as_chat_request, check_responses_request
from ember.server.responses.models import (
    IncompleteDetails,
    InputTokensDetails,
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputReasoning,
    OutputText,
    ReasoningText,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)
from ember.server.serving.context import ServingContext
from ember.server.serving.generation import cancel_on_disconnect, collect, merge_streams
from ember.server.serving.response_store import StoredResponse

# Chat fields a converted request may fail on, as the Responses API names them.
RESPONSES_PARAMS = {"messages": "input", "response_format": "text.format", "max_completion_tokens": "max_output_tokens",
                    "max_tokens": "max_output_tokens"}


async def create_response(context: ServingContext, raw_request: Request) -> Response:
    """Validate, admit and run one response (continuing a stored one with `previous_response_id`); store it when done
    unless asked not to."""
    request = parse_request(ResponsesRequest, await raw_request.body())
    model = resolve_model(request.model, context.model_names)
    check_responses_request(request)
    previous = None if request.previous_response_id is None else _previous(context, request.previous_response_id)
    items = [*(previous.conversation() if previous else []), *_input_items(request)]
    if previous is not None:
        request = _continuing(request, items)
    with _named_for_responses():
        chat = as_chat_request(request)
        check_chat_request(chat)
        tools = plan_tools(chat)
        params = chat_sampling_params(chat, context.config.sampling_defaults, tools)
    keeps = request.store is not False and context.response_store.enabled
    continued = None if previous is None else previous.response["id"]
    shell = _shell(request, model, tools, params).model_copy(update={"store": keeps, "previous_response_id": continued})

    def keep(response: ResponseObject) -> None:
        if keeps:
            context.response_store.put(response.model_dump(mode="json"), items)

    ticket = context.admission.admit(1)
    try:
        with _named_for_responses():
            stream = await start_chat(context, shell.id, chat, params, tools, ticket)
        if request.stream:
            events = ResponseEvents(shell, tools, context.config.reasoning_parser, on_end=keep).events(stream)
            return sse_response(events, ticket.release, context.drain)
        try:
            (output,) = await cancel_on_disconnect(context, raw_request, collect([stream], 1))
        finally:
            ticket.release()
        response = _finished(shell, output, tools, context.config.reasoning_parser)
        keep(response)
        return model_response(response)
    except BaseException:
        ticket.release()
        raise


def stored(context: ServingContext, response_id: str) -> StoredResponse:
    """The stored response `response_id` (the routes that read one); a 404 when there is none."""
    found = context.response_store.get(response_id)
    if found is None:
        raise ApiError(_not_kept(context, response_id), status_code=HTTPStatus.NOT_FOUND, error_type="not_found_error",
                       param="response_id", code="response_not_found")  # fmt: skip
    return found


def _previous(context: ServingContext, response_id: str) -> StoredResponse:
    """The response a request continues; a 400 naming previous_response_id when there is none (as OpenAI answers)."""
    found = context.response_store.get(response_id)
    if found is None:
        raise ApiError(_not_kept(context, response_id), param="previous_response_id", code="previous_response_not_found")
    return found


def _not_kept(context: ServingContext, response_id: str) -> str:
    return (f"No stored response with id {response_id!r}: it was made with store false, deleted, or is older than the "
            f"{context.response_store.max_responses} this server keeps (--max-stored-responses).")


def _input_items(request: ResponsesRequest) -> list[dict]:
    """The request's input as items to store (text: one user message), each with an id, as OpenAI lists them."""
    if isinstance(request.input, str):
        items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": request.input}]}]
    else:
        items = [item.model_dump(mode="json", exclude_none=True) for item in request.input]
    for item in items:
        item.setdefault("type", "message")
        if isinstance(item.get("content"), str):
            item["content"] = [{"type": "input_text", "text": item["content"]}]
        item.setdefault("id", f"{_ITEM_PREFIXES.get(item['type'], 'item')}_{uuid.uuid4().hex}")
    return items


_ITEM_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def _continuing(request: ResponsesRequest, items: list[dict]) -> ResponsesRequest:
    """The request with the stored conversation before its own input (validated again, as any input is)."""
    body = {**request.model_dump(mode="json", exclude_none=True, by_alias=True), "input": items}
    return parse_request(ResponsesRequest, json.dumps(body).encode())


def input_items_page(found: StoredResponse, order: str, limit: int, after: str | None) -> dict:
    """`GET /v1/responses/{id}/input_items`: the items a response answered, newest first by default (OpenAI's list)."""
    if order not in ("asc", "desc"):
        raise ApiError(f"Invalid order {order!r}: use 'asc' or 'desc'.", param="order", code="invalid_value")
    if not 1 <= limit <= 100:
        raise ApiError(f"Invalid limit {limit}: give 1 to 100.", param="limit", code="invalid_value")
    items = found.input_items if order == "asc" else found.input_items[::-1]
    if after is not None:
        ids = [item.get("id") for item in items]
        if after not in ids:
            raise ApiError(f"No input item with id {after!r} in this response.", param="after", code="invalid_value")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}  # fmt: skip


@contextlib.contextmanager
def _named_for_responses() -> Iterator[None]:
    """Renames the `param` of a chat-path error to the Responses field it came from."""
    try:
        yield
    except ApiError as error:
        head, _, rest = (error.param or "").partition(".")
        if head in RESPONSES_PARAMS:
            error.param = RESPONSES_PARAMS[head] + (f".{rest}" if rest and head != "messages" else "")
        raise


def _shell(request: ResponsesRequest, model: str, tools: ToolPlan | None, params: SamplingParams) -> ResponseObject:
    """The response as it starts: no output yet, the settings it runs with."""
    text_format = request.text.format if request.text is not None and request.text.format is not None else None
    return ResponseObject(
        id=f"resp_{uuid.uuid4().hex}",
        created_at=int(time.time()),
        status="in_progress",
        model=model,
        output=[],
        instructions=request.instructions,
        max_output_tokens=request.max_output_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        tools=[tool.model_dump(exclude_none=True) for tool in request.tools or []],
        tool_choice=_tool_choice(request, tools),
        parallel_tool_calls=request.parallel_tool_calls is not False,
        text={"format": text_format.model_dump(exclude_none=True, by_alias=True) if text_format else {"type": "text"}},
        metadata=request.metadata or {},
        user=request.user,
    )


def _tool_choice(request: ResponsesRequest, tools: ToolPlan | None) -> str | dict:
    if request.tool_choice is not None and not isinstance(request.tool_choice, str):
        return request.tool_choice.model_dump()
    return request.tool_choice or ("auto" if tools is not None else "none")


def _finished(shell: ResponseObject, output: RequestOutput, tools: ToolPlan | None, parser: str | None) -> ResponseObject:
    """The whole response once generation has ended (a reasoning item first where a parser found reasoning)."""
    completion = output.outputs[0]
    reasoning, text = (None, completion.text) if parser is None else split_reasoning(completion.text, parser)
    text, calls = (text, []) if tools is None else tools.read(text)
    is_cut = completion.finish_reason == "length"
    items: list[OutputItem] = []
    if reasoning is not None:
        items.append(_reasoning(f"rs_{uuid.uuid4().hex}", reasoning, "completed"))
    shown = text.strip() if calls else text
    if shown or not calls:
        items.append(_message(f"msg_{uuid.uuid4().hex}", shown, "incomplete" if is_cut else "completed"))
    items.extend(_function_call(call, "completed") for call in calls)
    return _ended(shell, output, items, len(completion.token_ids), is_cut)


def _ended(shell: ResponseObject, output: RequestOutput, items: list[OutputItem], num_output: int, is_cut: bool) -> ResponseObject:
    num_input = len(output.prompt_token_ids)
    usage = ResponseUsage(input_tokens=num_input, input_tokens_details=InputTokensDetails(cached_tokens=output.num_cached_tokens),
                          output_tokens=num_output, total_tokens=num_input + num_output)  # fmt: skip
    return shell.model_copy(update={
        "status": "incomplete" if is_cut else "completed", "output": items, "usage": usage,
        "incomplete_details": IncompleteDetails(reason="max_output_tokens") if is_cut else None,
    })  # fmt: skip


def _message(item_id: str, text: str, status: str) -> OutputMessage:
    return OutputMessage(id=item_id, status=status, content=[OutputText(text=text)] if status != "in_progress" else [])


def _reasoning(item_id: str, text: str, status: str) -> OutputReasoning:
    return OutputReasoning(id=item_id, status=status, content=[ReasoningText(text=text)] if status != "in_progress" else [])


def _function_call(call: ToolCall, status: str) -> OutputFunctionCall:
    arguments = call.function.arguments if status != "in_progress" else ""
    return OutputFunctionCall(id=f"fc_{call.id.removeprefix('call_')}", call_id=call.id, name=call.function.name,
                              arguments=arguments, status=status)  # fmt: skip


class ResponseEvents:
    """One streamed response as the Responses API's typed events, numbered in order. Reasoning (with a parser)
    comes first as `response.reasoning_text.delta` events of a reasoning item; the text as
    `response.output_text.delta` events of one message item (opened at its first text); calls, read when
    generation ends, as function_call items with their arguments; then `response.completed` (or
    `response.incomplete` when cut by max_output_tokens) carrying the whole response."""

    def __init__(self, shell: ResponseObject, tools: ToolPlan | None, parser: str | None = None,
                 on_end: Callable[[ResponseObject], None] | None = None) -> None:
        self.shell = shell
        self.on_end = on_end  # given the whole response once generation has ended (to store it)
        self.reader = ToolCallStream(tools) if tools is not None else None
        self.thoughts = ReasoningStream(parser) if parser is not None else None
        self.sequence = 0
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.reasoning_id = f"rs_{uuid.uuid4().hex}"
        self.reasoning: str | None = None  # None until the reasoning item opens
        self.reasoning_done = False
        self.text: str | None = None  # None until the message item opens

    async def events(self, stream: AsyncIterator[RequestOutput]) -> AsyncIterator[str]:
        yield self._event("response.created", response=self.shell)
        yield self._event("response.in_progress", response=self.shell)
        num_output, last = 0, None
        merged = merge_streams([stream])
        try:
            async for _, delta in merged:
                last, part = delta, delta.outputs[0]
                num_output += len(part.token_ids)
                for event in self._step(part.text, part.finish_reason is not None):
                    yield event
        finally:
            await merged.aclose()
        if last is None:
            return
        for event in self._ending(last, num_output):
            yield event

    def _step(self, piece: str, is_last: bool) -> list[str]:
        """A step's events: its reasoning, then its content (what the call reader lets through)."""
        events = []
        if self.thoughts is not None:
            reasoning, piece = self.thoughts.split(piece, is_last)
            events.extend(self._reasoning_text(reasoning))
        content = self.reader.content(piece) if self.reader else piece
        if content:
            events.extend(self._reasoning_done())
        events.extend(self._text(content))
        return events

    def _ending(self, last: RequestOutput, num_output: int) -> list[str]:
        rest, calls = self.reader.finish() if self.reader else ("", [])
        is_cut = last.outputs[0].finish_reason == "length"
        events = [*self._reasoning_done(), *self._text(rest)]
        items: list[OutputItem] = []
        if self.reasoning is not None:
            items.append(_reasoning(self.reasoning_id, self.reasoning, "completed"))
        if self.text is not None or not calls:
            events.extend(self._text_done(is_cut))
            items.append(_message(self.message_id, self.text, "incomplete" if is_cut else "completed"))
        for call in calls:
            events.extend(self._call(len(items), call))
            items.append(_function_call(call, "completed"))
        response = _ended(self.shell, last, items, num_output, is_cut)
        if self.on_end is not None:
            self.on_end(response)
        events.append(self._event("response.incomplete" if is_cut else "response.completed", response=response))
        return events

    @property
    def _message_index(self) -> int:
        """The message item's place in the output: after the reasoning item, if there is one."""
        return 0 if self.reasoning is None else 1

    def _reasoning_text(self, piece: str) -> list[str]:
        if not piece:
            return []
        events = []
        if self.reasoning is None:
            self.reasoning = ""
            events.append(self._event("response.output_item.added", output_index=0,
                                      item=_reasoning(self.reasoning_id, "", "in_progress")))  # fmt: skip
        self.reasoning += piece
        events.append(self._event("response.reasoning_text.delta", item_id=self.reasoning_id, output_index=0, content_index=0,
                                  delta=piece))  # fmt: skip
        return events

    def _reasoning_done(self) -> list[str]:
        """The reasoning item's closing events, once (nothing without reasoning)."""
        if self.reasoning is None or self.reasoning_done:
            return []
        self.reasoning_done = True
        return [
            self._event("response.reasoning_text.done", item_id=self.reasoning_id, output_index=0, content_index=0,
                        text=self.reasoning),  # fmt: skip
            self._event("response.output_item.done", output_index=0, item=_reasoning(self.reasoning_id, self.reasoning, "completed")),
        ]

    def _text(self, piece: str) -> list[str]:
        if not piece:
            return []
        events = [] if self.text is not None else self._open_message()
        self.text += piece
        events.append(self._event("response.output_text.delta", item_id=self.message_id, output_index=self._message_index,
                                  content_index=0, delta=piece, logprobs=[]))  # fmt: skip
        return events

    def _open_message(self) -> list[str]:
        self.text = ""
        index = self._message_index
        return [
            self._event("response.output_item.added", output_index=index, item=_message(self.message_id, "", "in_progress")),
            self._event("response.content_part.added", item_id=self.message_id, output_index=index, content_index=0,
                        part=OutputText(text="")),  # fmt: skip
        ]

    def _text_done(self, is_cut: bool) -> list[str]:
        events = [] if self.text is not None else self._open_message()
        part, index = OutputText(text=self.text), self._message_index
        return [
            *events,
            self._event("response.output_text.done", item_id=self.message_id, output_index=index, content_index=0,
                        text=self.text, logprobs=[]),  # fmt: skip
            self._event("response.content_part.done", item_id=self.message_id, output_index=index, content_index=0, part=part),
            self._event("response.output_item.done", output_index=index,
                        item=_message(self.message_id, self.text, "incomplete" if is_cut else "completed")),  # fmt: skip
        ]

    def _call(self, index: int, call: ToolCall) -> list[str]:
        opened, done = _function_call(call, "in_progress"), _function_call(call, "completed")
        return [
            self._event("response.output_item.added", output_index=index, item=opened),
            self._event("response.function_call_arguments.delta", item_id=done.id, output_index=index, delta=done.arguments),
            self._event("response.function_call_arguments.done", item_id=done.id, output_index=index, name=done.name,
                        arguments=done.arguments),  # fmt: skip
            self._event("response.output_item.done", output_index=index, item=done),
        ]

    def _event(self, kind: str, **fields) -> str:
        payload = {"type": kind, "sequence_number": self.sequence}
        payload.update({name: value.model_dump(mode="json") if hasattr(value, "model_dump") else value
                        for name, value in fields.items()})  # fmt: skip
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"
