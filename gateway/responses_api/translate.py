"""Owns the pure conversion of a Responses API request into a chat job, and the response it starts as.

A response is a chat job: ``instructions`` becomes a system message before the
conversation; the conversation is the stored one ``previous_response_id`` names
(``history``, read by the service) followed by this ``input``
(``gateway/responses_api/conversation.py``); ``max_output_tokens`` is
``max_tokens``. Function tools go to the template as ``ChatPrompt.tools`` and the
tool choice to the worker as ``GenerationJob.tool_choice`` (``parallel_tool_calls``
is its ``parallel``). The job's ``constraint`` is ``text.format``'s JSON; the
call a forced tool choice (``required`` or a named function) puts on the output is
derived from the tool choice by the worker (``shared/structured/tools.py``'s
``call_constraint``), so it is not in the job twice. Asking both is refused: one
output cannot be a call and a document. Every constraint is compiled here
(``grammars.check``) so one that cannot be enforced is a 400 before anything is
queued. No I/O and no clock: ids, times and history come in as arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.responses_api.conversation import chat_messages
from gateway.responses_api.objects import Response
from gateway.responses_api.schema import ResponseCreateRequest, TextFormat, ToolChoiceParam, ToolParam
from shared.errors import InvalidRequest
from shared.protocol import (
    ChatMessage,
    ChatPrompt,
    FunctionTool,
    GenerationJob,
    JsonConstraint,
    SamplingSpec,
    ToolChoice,
)
from shared.structured import grammars
from shared.structured.tools import call_constraint, check_tools

RESPONSE_ID_PREFIX = "resp_"
MESSAGE_ID_PREFIX = "msg_"
REASONING_ID_PREFIX = "rs_"
CALL_ITEM_ID_PREFIX = "fc_"
CALL_ID_PREFIX = "call_"


def response_id(request_id: str) -> str:
    return RESPONSE_ID_PREFIX + request_id


def message_id(request_id: str) -> str:
    return MESSAGE_ID_PREFIX + request_id


def conversation(request: ResponseCreateRequest, history: Sequence[ChatMessage] = ()) -> list[ChatMessage]:
    """The conversation this response answers, without ``instructions`` (a continuation drops them)."""
    return [*history, *chat_messages(request.input, history)]


def response_job(
    request: ResponseCreateRequest,
    request_id: str,
    created_at: float,
    history: Sequence[ChatMessage] = (),
) -> GenerationJob:
    """The chat job answering ``request``, continuing ``history`` (the previous response's conversation)."""
    system = [ChatMessage(role="system", content=request.instructions)] if request.instructions else []
    tools = function_tools(request.tools)
    choice = tool_choice(request, tools)
    sampling = SamplingSpec(
        max_tokens=request.max_output_tokens, temperature=request.temperature, top_p=request.top_p
    )
    return GenerationJob(
        request_id=request_id,
        model=request.model,
        prompt=ChatPrompt(messages=system + conversation(request, history), tools=tools or None),
        sampling=sampling,
        created_at=created_at,
        tool_choice=choice,
        constraint=_constraint(request, tools, choice),
    )


def function_tools(tools: list[ToolParam] | None) -> list[FunctionTool]:
    """The request's tools as the template's; anything but a named function tool is refused."""
    functions = []
    for index, tool in enumerate(tools or []):
        if tool.type != "function":
            raise InvalidRequest(
                f"Tools of type '{tool.type}' are not supported; only function tools are.",
                param=f"tools.{index}.type",
            )
        if not tool.name:
            raise InvalidRequest("A function tool needs a name.", param=f"tools.{index}.name")
        functions.append(
            FunctionTool(
                name=tool.name, description=tool.description, parameters=tool.parameters, strict=tool.strict
            )
        )
    return functions


def tool_choice(request: ResponseCreateRequest, tools: list[FunctionTool]) -> ToolChoice | None:
    """How the worker treats the tools (None: there are none), checked against them."""
    choice = _choice(request.tool_choice, request.parallel_tool_calls is not False)
    if not tools and choice.mode in ("none", "auto"):
        return None
    try:
        check_tools(tools, choice)
    except InvalidRequest as error:
        raise _flat_tool_param(error) from error
    return choice


def _flat_tool_param(error: InvalidRequest) -> InvalidRequest:
    """``check_tools`` names chat completions' nested place (``tools.0.function.parameters``); a
    Responses tool is flat (``tools.0.parameters``)."""
    if error.param is None or ".function." not in error.param:
        return error
    param = error.param.replace(".function.", ".")
    return InvalidRequest(error.message.replace(error.param, param), param=param)


def _choice(given: str | ToolChoiceParam | None, parallel: bool) -> ToolChoice:
    if isinstance(given, ToolChoiceParam):
        if given.type != "function" or not given.name:
            raise InvalidRequest(
                f"tool_choice of type '{given.type}' is not supported; name a function "
                '({"type": "function", "name": ...}) or use none, auto or required.',
                param="tool_choice",
            )
        return ToolChoice(mode="named", name=given.name, parallel=parallel)
    return ToolChoice(mode=given or "auto", parallel=parallel)


def _constraint(
    request: ResponseCreateRequest, tools: list[FunctionTool], choice: ToolChoice | None
) -> JsonConstraint | None:
    """``text.format``'s constraint, once it and the call a forced tool choice asks for compile."""
    calls = call_constraint(tools, choice) if choice is not None else None
    text_format = request.text.format if request.text else None
    constraint = format_constraint(text_format) if text_format is not None else None
    if calls is not None and constraint is not None:
        raise InvalidRequest(
            "text.format cannot be combined with tool_choice 'required' or a named function: "
            "the output would have to be both.",
            param="text.format",
        )
    for compiled in (calls, constraint):
        if compiled is not None:
            grammars.check(compiled)
    return constraint


def format_constraint(text_format: TextFormat) -> JsonConstraint | None:
    """What ``text.format`` asks of the output: nothing (text), any JSON object, or a schema."""
    if text_format.type == "text":
        return None
    if text_format.type == "json_object":
        return JsonConstraint(json_schema=None, param="text.format")
    if text_format.json_schema is None:
        raise InvalidRequest("text.format of type json_schema needs a schema.", param="text.format.schema")
    return JsonConstraint(json_schema=text_format.json_schema, param="text.format.schema")


def pending_response(
    request: ResponseCreateRequest, request_id: str, created_at: float, status: str = "queued"
) -> Response:
    """The response before any output: what ``background`` answers at once, and a stream's first event."""
    return Response(
        id=response_id(request_id),
        created_at=created_at,
        status=status,
        background=bool(request.background),
        model=request.model,
        instructions=request.instructions,
        max_output_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        metadata=request.metadata,
        parallel_tool_calls=request.parallel_tool_calls is not False,
        tool_choice=_echoed_choice(request.tool_choice),
        tools=[tool.model_dump(exclude_none=True) for tool in request.tools or []],
        text=_echoed_text(request),
        previous_response_id=request.previous_response_id,
        store=request.store is not False,
    )


def _echoed_choice(given: str | ToolChoiceParam | None) -> str | dict[str, Any]:
    if isinstance(given, ToolChoiceParam):
        return given.model_dump(exclude_none=True)
    return given or "auto"


def _echoed_text(request: ResponseCreateRequest) -> dict[str, Any]:
    if request.text is None or request.text.format is None:
        return {"format": {"type": "text"}}
    return {"format": request.text.format.model_dump(by_alias=True, exclude_none=True)}


def as_created(stored: Response) -> Response:
    """The response ``stored`` was when it was created (``pending_response``): a replayed stream
    starts from it, as the first one did."""
    return stored.model_copy(
        update={
            "status": "queued",
            "output": [],
            "error": None,
            "incomplete_details": None,
            "usage": None,
            "completed_at": None,
        }
    )
