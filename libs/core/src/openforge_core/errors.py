"""Domain errors that every service raises and the gRPC layer maps to status codes.

Domain code (``services/*/domain``) raises these and never imports grpc; the
server interceptor in :mod:`openforge_core.rpc.interceptor` turns each into a
gRPC status with a ``google.rpc.ErrorInfo`` (reason, domain, metadata) and, for
invalid arguments, a ``google.rpc.BadRequest`` listing field violations
(the rich error model, https://google.aip.dev/193).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


class ErrorCode(enum.Enum):
    """The canonical codes we use; values are the gRPC status code numbers."""

    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


@dataclass(frozen=True)
class FieldViolation:
    """One invalid field of a request.

    Attributes:
        field: Path of the field in the request, e.g. ``"sampling.max_tokens"``.
        description: Why the value is invalid, for a human.
    """

    field: str
    description: str


class OpenForgeError(Exception):
    """Base of every error a service reports to its callers.

    Args:
        message: Human-readable description; becomes the status message.
        reason: UPPER_SNAKE machine-readable reason (``google.rpc.ErrorInfo.reason``).
        metadata: Extra string key/values for ``ErrorInfo.metadata``.
        violations: Field violations (only meaningful for INVALID_ARGUMENT).
    """

    code: ErrorCode = ErrorCode.INTERNAL
    default_reason: str = "INTERNAL"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
        violations: Sequence[FieldViolation] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.metadata: dict[str, str] = dict(metadata or {})
        self.violations: tuple[FieldViolation, ...] = tuple(violations)


class InvalidArgument(OpenForgeError):
    """The request is malformed; retrying it unchanged cannot succeed."""

    code = ErrorCode.INVALID_ARGUMENT
    default_reason = "INVALID_ARGUMENT"

    @classmethod
    def field(cls, field: str, description: str, *, reason: str | None = None) -> InvalidArgument:
        """Builds the error for a single invalid field."""
        return cls(f"{field}: {description}", reason=reason, violations=[FieldViolation(field, description)])


class NotFound(OpenForgeError):
    """The named entity does not exist."""

    code = ErrorCode.NOT_FOUND
    default_reason = "NOT_FOUND"


class AlreadyExists(OpenForgeError):
    """The entity exists and the request would create it again differently."""

    code = ErrorCode.ALREADY_EXISTS
    default_reason = "ALREADY_EXISTS"


class FailedPrecondition(OpenForgeError):
    """The system is not in a state where the request can run."""

    code = ErrorCode.FAILED_PRECONDITION
    default_reason = "FAILED_PRECONDITION"


class ResourceExhausted(OpenForgeError):
    """A limit or quota was reached."""

    code = ErrorCode.RESOURCE_EXHAUSTED
    default_reason = "RESOURCE_EXHAUSTED"


class Unauthenticated(OpenForgeError):
    """Missing, unknown or expired credentials."""

    code = ErrorCode.UNAUTHENTICATED
    default_reason = "UNAUTHENTICATED"


class Unavailable(OpenForgeError):
    """A dependency or the engine is down; retrying later may succeed."""

    code = ErrorCode.UNAVAILABLE
    default_reason = "UNAVAILABLE"


class DataLoss(OpenForgeError):
    """Data is corrupt (e.g. a checksum mismatch)."""

    code = ErrorCode.DATA_LOSS
    default_reason = "DATA_LOSS"
