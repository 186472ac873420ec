"""What the model produced in one call, parsed, and the errors a call can end with.

:class:`AssistantOutput` is the parsed completion (reasoning, text, tool
calls) every protocol encoder turns into its own wire shape; :class:`ApiError`
is a failure with the HTTP status and error kind each protocol maps into its
own error body (see the protocol modules).
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass, field
from typing import Any

from openforge_proxy.domain.conversation import ToolKind


class Finish(enum.Enum):
    """Why generation ended (mirrors ``openforge.common.v1.FinishReason``)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass
class ToolCallOut:
    """A complete, valid tool call the model made.

    Attributes:
        id: Call id emitted to the harness (alphanumeric: ``toolu<hex>`` or
            ``call<hex>``, so that OpenClaw's stripping of non-alphanumerics
            leaves it unchanged; reference §6).
        name: Tool name.
        arguments: Parsed arguments (object), or the raw input for CUSTOM tools.
        arguments_json: The arguments as the model wrote them (JSON text), or
            the raw input for CUSTOM tools: what the harness receives.
        kind: FUNCTION or CUSTOM.
        namespace: Responses namespace of the tool, if any.
        item_id: Responses output item id (``fc<hex>``/``ctc<hex>``).
    """

    id: str
    name: str
    arguments: Any
    arguments_json: str
    kind: ToolKind = ToolKind.FUNCTION
    namespace: str | None = None
    item_id: str = ""


@dataclass
class AssistantOutput:
    """One parsed completion.

    Attributes:
        reasoning: Reasoning text ("" if none).
        text: Visible text ("" if none).
        tool_calls: Complete tool calls, in order.
        finish: Why generation ended.
        ids: Item ids emitted for this output (message, reasoning), by kind.
        signature: Opaque value returned as Anthropic thinking ``signature`` and
            Responses ``encrypted_content``; harnesses echo it back, which lets
            the proxy find the turn again.
        token_logprobs: When the harness asked for logprobs: ``(bytes, logprob)`` of every
            sampled token but the end-of-turn/stop token, in order (``bytes``: what the token
            stands for, possibly part of a multi-byte character; logprob in nats, as the engine
            reported it, None if it reported none). None when not asked.
    """

    reasoning: str = ""
    text: str = ""
    tool_calls: list[ToolCallOut] = field(default_factory=list)
    finish: Finish = Finish.STOP
    ids: dict[str, str] = field(default_factory=dict)
    signature: str = ""
    token_logprobs: list[tuple[bytes, float | None]] | None = None

    def refs(self) -> list[str]:
        """Every identifier of this output a harness may echo back."""
        out = [v for v in self.ids.values() if v]
        if self.signature:
            out.append(self.signature)
        for tc in self.tool_calls:
            out.append(tc.id)
            if tc.item_id:
                out.append(tc.item_id)
        return out


@dataclass(frozen=True)
class Usage:
    """Token counts reported to the harness.

    Attributes:
        prompt_tokens: Prompt tokens the engine saw.
        completion_tokens: Tokens sampled.
        cached_tokens: Prompt tokens reused from earlier calls of the session
            (shown as cache reads).
        reasoning_tokens: Sampled tokens that were reasoning.
    """

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0


class ErrorKind(enum.Enum):
    """What went wrong, independent of the wire protocol."""

    INVALID_REQUEST = "invalid_request"
    AUTHENTICATION = "authentication"
    NOT_FOUND = "not_found"
    TOO_LARGE = "too_large"
    LIMIT_REACHED = "limit_reached"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


class ApiError(Exception):
    """A call that fails before its response started.

    Args:
        kind: What went wrong.
        message: For the harness (never contains a key).
        status: HTTP status; by default the one of ``kind`` in
            :data:`DEFAULT_STATUS`.
        retry_after_s: ``retry-after`` header value, seconds, if any.
    """

    def __init__(
        self, kind: ErrorKind, message: str, *, status: int | None = None, retry_after_s: int | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status if status is not None else DEFAULT_STATUS[kind]
        self.retry_after_s = retry_after_s


#: HTTP status per error kind.
#:
#: * ``LIMIT_REACHED`` → 400: the status on which Codex and OpenClaw stop at once
#:   and Claude Code retries exactly once before exiting 1 (reference §2-§5,
#:   "To end a rollout quickly, return 400"). 429 or 5xx would make all three
#:   retry for minutes.
#: * ``UNAVAILABLE`` (the engine is down) → 503: Codex retries 5xx with backoff
#:   (up to about 30 attempts), OpenClaw retries, and Claude Code treats it like
#:   500 (11 attempts over about 3 minutes), so a restarting engine does not
#:   end the rollout. Anthropic has no 503 type; the body says ``api_error``.
DEFAULT_STATUS: dict[ErrorKind, int] = {
    ErrorKind.INVALID_REQUEST: 400,
    ErrorKind.AUTHENTICATION: 401,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.LIMIT_REACHED: 400,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.INTERNAL: 500,
}


def new_id(prefix: str) -> str:
    """``prefix`` + 24 hex characters: alphanumeric, so harnesses never rewrite it."""
    return prefix + secrets.token_hex(12)
