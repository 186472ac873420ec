"""One wire API as one object: :class:`WireCodec`, and :data:`CODECS`, its three implementations.

Everything the call pipeline does differently per API goes through a codec: the request into the
canonical conversation, the answer (whole, or streamed as SSE) and errors back into the API's own
shapes, and the header the request id travels in. The pipeline itself names no API.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from openforge_proxy.domain.conversation import CanonicalRequest, WireApi
from openforge_proxy.domain.engine import Sampling
from openforge_proxy.domain.output import ApiError, AssistantOutput, Usage
from openforge_proxy.domain.protocols import anthropic, chat, responses
from openforge_proxy.domain.protocols.memo import ConversationMemo


@dataclass(frozen=True)
class ParseContext:
    """What a session lends the parse of its next request (nothing: a request parsed alone).

    Attributes:
        memo: The session's previous conversation of this API (its unchanged start is not
            converted again; Anthropic Messages and Chat Completions).
        turn_of: An item reference (item id, call id, encrypted content) to the generated turn it
            belongs to (Responses: which assistant items form one message).
    """

    memo: ConversationMemo | None = None
    turn_of: Callable[[str], str | None] | None = None


class StreamEncoder(Protocol):
    """The SSE bytes of one streamed answer, in order: the preamble, each delta, the end (or a
    mid-stream error)."""

    def start(self, usage: Usage) -> bytes: ...
    def reasoning(self, delta: str) -> bytes: ...
    def text(self, delta: str) -> bytes: ...
    def finish(self, usage: Usage) -> bytes: ...
    def error(self, message: str) -> bytes: ...


class WireCodec(Protocol):
    """One wire API.

    Attributes:
        wire: The API.
        id_header: The response header the request id travels in.
    """

    wire: WireApi
    id_header: str

    def parse(self, body: dict[str, Any], context: ParseContext) -> CanonicalRequest:
        """The canonical request of a parsed body.

        Raises:
            InvalidArgument: The body is not a request of this API.
            orjson.JSONEncodeError: A part of it cannot be written again (nested too deep).
        """
        ...

    def error_body(self, err: ApiError, request_id: str) -> dict[str, Any]:
        """The error's body in the API's shape."""
        ...

    def prepare_ids(self, out: AssistantOutput, request: CanonicalRequest) -> None:
        """Assigns the answer's ids (message, items, tool calls) the API's way."""
        ...

    def response_body(
        self, request: CanonicalRequest, out: AssistantOutput, usage: Usage, sampling: Sampling
    ) -> dict[str, Any]:
        """The whole (non-streamed) answer."""
        ...

    def stream_encoder(self, request: CanonicalRequest, out: AssistantOutput, sampling: Sampling) -> StreamEncoder:
        """The encoder of a streamed answer (it assigns the answer's ids)."""
        ...


class AnthropicCodec:
    """Anthropic Messages (:mod:`.anthropic`)."""

    wire = WireApi.ANTHROPIC_MESSAGES
    id_header = "request-id"

    def parse(self, body: dict[str, Any], context: ParseContext) -> CanonicalRequest:
        return anthropic.parse(body, context.memo)

    def error_body(self, err: ApiError, request_id: str) -> dict[str, Any]:
        return anthropic.error_body(err, request_id)

    def prepare_ids(self, out: AssistantOutput, request: CanonicalRequest) -> None:
        anthropic.prepare_ids(out)

    def response_body(
        self, request: CanonicalRequest, out: AssistantOutput, usage: Usage, sampling: Sampling
    ) -> dict[str, Any]:
        return anthropic.response_body(out, usage, request.model, request.want_reasoning)

    def stream_encoder(self, request: CanonicalRequest, out: AssistantOutput, sampling: Sampling) -> StreamEncoder:
        return anthropic.StreamEncoder(out, request.model, request.want_reasoning)


class ChatCodec:
    """OpenAI Chat Completions (:mod:`.chat`)."""

    wire = WireApi.OPENAI_CHAT
    id_header = "x-request-id"

    def parse(self, body: dict[str, Any], context: ParseContext) -> CanonicalRequest:
        return chat.parse(body, context.memo)

    def error_body(self, err: ApiError, request_id: str) -> dict[str, Any]:
        return chat.error_body(err, request_id)

    def prepare_ids(self, out: AssistantOutput, request: CanonicalRequest) -> None:
        chat.prepare_ids(out)

    def response_body(
        self, request: CanonicalRequest, out: AssistantOutput, usage: Usage, sampling: Sampling
    ) -> dict[str, Any]:
        return chat.response_body(out, usage, request.model)

    def stream_encoder(self, request: CanonicalRequest, out: AssistantOutput, sampling: Sampling) -> StreamEncoder:
        return chat.StreamEncoder(out, request.model, request.include_usage)


class ResponsesCodec:
    """OpenAI Responses (:mod:`.responses`)."""

    wire = WireApi.OPENAI_RESPONSES
    id_header = "x-request-id"

    def parse(self, body: dict[str, Any], context: ParseContext) -> CanonicalRequest:
        return responses.parse(body, context.turn_of)

    def error_body(self, err: ApiError, request_id: str) -> dict[str, Any]:
        return responses.error_body(err, request_id)

    def prepare_ids(self, out: AssistantOutput, request: CanonicalRequest) -> None:
        responses.prepare_ids(out, request)

    def response_body(
        self, request: CanonicalRequest, out: AssistantOutput, usage: Usage, sampling: Sampling
    ) -> dict[str, Any]:
        return responses.response_body(request, out, usage, sampling)

    def stream_encoder(self, request: CanonicalRequest, out: AssistantOutput, sampling: Sampling) -> StreamEncoder:
        return responses.StreamEncoder(request, out, sampling)


#: The codec of each wire API.
CODECS: dict[WireApi, WireCodec] = {c.wire: c for c in (AnthropicCodec(), ChatCodec(), ResponsesCodec())}
