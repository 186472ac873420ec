"""Every request is decoded and checked before a handler sees it; a bad one is INVALID_ARGUMENT.

gRPC decodes a request with the method's ``request_deserializer`` before any handler or
interceptor code runs, and answers UNKNOWN when that raises (bytes that are not the message,
a string field that is not UTF-8). :class:`RequestValidationInterceptor` gives each unary-request
method a deserializer that never raises -- a message that does not decode becomes an
:class:`Undecodable` -- and a handler that turns an ``Undecodable`` into
:class:`~openforge_core.errors.InvalidArgument` naming the field that broke, and checks every
string field of a decoded request against :mod:`openforge_core.field_rules`. The error then
travels like any other (the :class:`~openforge_core.rpc.interceptor.ErrorMappingInterceptor`
outside it adds the ``BadRequest``).

Streaming-request methods (only server reflection) keep their own deserializer.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from openforge_core import field_rules
from openforge_core.errors import FieldViolation, InvalidArgument
from openforge_core.protowire import I32, I64, LEN, VARINT, read_varint
from openforge_core.rpc.wrap import GuardingInterceptor, wrap_handler


@dataclass(frozen=True)
class Undecodable:
    """A request whose bytes are not its message.

    Attributes:
        violation: The field that broke (or ``"request"``) and why.
    """

    violation: FieldViolation


def _field_path(desc: Descriptor, num: int, prefix: str, seen: dict[int, int]) -> tuple[str, FieldDescriptor | None]:
    fd = desc.fields_by_number.get(num)
    if fd is None:
        return f"{prefix}[field {num}]" if prefix else f"[field {num}]", None
    path = f"{prefix}{fd.name}"
    if fd.is_repeated and fd.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE):
        index = seen.get(num, 0)
        seen[num] = index + 1
        path = f"{path}[{index}]"
    return path, fd


def locate(desc: Descriptor, data: bytes, prefix: str = "") -> FieldViolation | None:
    """Finds the field that makes ``data`` fail to decode as ``desc``.

    Walks the wire format (https://protobuf.dev/programming-guides/encoding/): a truncated or
    malformed field, an invalid wire type, a string that is not UTF-8, recursing into message
    fields.

    Args:
        desc: The message type.
        data: Its serialized bytes.
        prefix: Path of the enclosing field (``"tasks[0]."``).

    Returns:
        The first bad field, or None if the walk found nothing wrong.
    """
    pos, n = 0, len(data)
    seen: dict[int, int] = {}
    while pos < n:
        try:
            key, pos = read_varint(data, pos)
        except ValueError:
            return FieldViolation(prefix.rstrip(".") or "request", "truncated field tag")
        num, wire = key >> 3, key & 7
        if num == 0:
            return FieldViolation(prefix.rstrip(".") or "request", "field number 0 is not valid")
        path, fd = _field_path(desc, num, prefix, seen)
        try:
            if wire == VARINT:
                _, pos = read_varint(data, pos)
            elif wire in (I64, I32):
                pos += 8 if wire == I64 else 4
                if pos > n:
                    raise ValueError("truncated fixed-width value")
            elif wire == LEN:
                size, pos = read_varint(data, pos)
                if pos + size > n:
                    raise ValueError(f"length {size} runs past the end of the message")
                payload, pos = data[pos : pos + size], pos + size
                if fd is not None and fd.type == FieldDescriptor.TYPE_STRING:
                    payload.decode("utf-8")
                elif fd is not None and fd.type == FieldDescriptor.TYPE_MESSAGE and fd.message_type is not None:
                    inner = locate(fd.message_type, payload, f"{path}.")
                    if inner is not None:
                        return inner
            else:
                raise ValueError(f"wire type {wire} is not valid here")
        except UnicodeDecodeError:
            return FieldViolation(path, "is not valid UTF-8")
        except ValueError as exc:
            return FieldViolation(path, str(exc))
    return None


def tolerant(deserializer: Callable[[bytes], Any], desc: Descriptor | None) -> Callable[[bytes], Any]:
    """Wraps a request deserializer so it returns an :class:`Undecodable` instead of raising."""

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as exc:
            try:
                found = locate(desc, data) if desc is not None else None
            except Exception:  # the walk is a courtesy: never let it turn INVALID_ARGUMENT into UNKNOWN
                found = None
            name = desc.full_name if desc is not None else "the request message"
            return Undecodable(found or FieldViolation("request", f"not a valid {name}: {exc}"))

    return deserialize


def check_request(request: Any) -> None:
    """Raises INVALID_ARGUMENT for an undecodable request or a string field breaking its rule.

    Raises:
        InvalidArgument: With one field violation per bad field.
    """
    if isinstance(request, Undecodable):
        v = request.violation
        raise InvalidArgument(f"{v.field}: {v.description}", reason="UNDECODABLE_REQUEST", violations=[v])
    if isinstance(request, Message):
        field_rules.check_message(request)


def _descriptor(deserializer: Any) -> Descriptor | None:
    # Generated stubs pass ``<Message>.FromString``; its ``__self__`` is the message class.
    owner = getattr(deserializer, "__self__", None)
    desc = getattr(owner, "DESCRIPTOR", None)
    return desc if isinstance(desc, Descriptor) else None


class RequestValidationInterceptor(GuardingInterceptor):
    """Checks every request before its handler runs (see the module docstring); each message of a
    client stream as the handler reads it.

    Place it after the error-mapping interceptor, so the InvalidArgument it raises is mapped.
    """

    def wrap(self, method: str, handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
        if handler.request_deserializer is None:
            return handler
        deserializer = tolerant(handler.request_deserializer, _descriptor(handler.request_deserializer))
        if handler.stream_unary is not None:
            return _checked_client_stream(handler, deserializer)

        @contextlib.asynccontextmanager
        async def checked(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[None]:
            check_request(request)
            yield

        return wrap_handler(handler, checked, deserializer)


def _checked_client_stream(
    handler: grpc.RpcMethodHandler[Any, Any], deserializer: Any
) -> grpc.RpcMethodHandler[Any, Any]:
    """A client-streaming handler whose messages are each checked as the handler reads them; a
    refused stream is read to its end before its error is returned."""
    inner: Any = handler.stream_unary

    async def checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        async def each() -> AsyncIterator[Any]:
            async for request in requests:
                check_request(request)
                yield request

        try:
            return await inner(each(), context)
        except Exception:
            # read what the client still sends (a gRPC aio client still sending when the call
            # ends gets INTERNAL instead of the status raised here)
            async for _ in requests:
                pass
            raise

    return grpc.stream_unary_rpc_method_handler(
        checked, request_deserializer=deserializer, response_serializer=handler.response_serializer
    )
