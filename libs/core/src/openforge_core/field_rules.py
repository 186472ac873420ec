"""What a string field of a request may hold: one table of rules, the same in every service.

Every service's requests name things by the same field names (``run_id``, ``rollout_id``,
``request_id``, ``config_path``...), and a name means the same thing wherever it appears, so
the rule of a string field is looked up by its name in :data:`FIELD_RULES`; a name not in the
table gets :data:`TEXT` (no NUL, bounded). The shared gRPC server checks every request it
decodes against the table (:mod:`openforge_core.rpc.validation`) before a handler runs, so a
servicer only says which fields it requires (:func:`require`).

The rules:

* :data:`ID` -- ids of runs, rollouts, groups, tasks, task sets and harnesses. They become file
  and folder names (sandboxes, checkpoints, task folders) and label values, so: 1 to 128 ASCII
  letters, digits, ``.``, ``_`` or ``-``, starting with a letter or digit -- no path
  separators, no leading dot (so never ``.`` or ``..``), no NUL, no whitespace.
* :data:`KEY` -- idempotency keys (``request_id``). They are built from ids
  (``<rollout_id>/<call_id>/<attempt>``, ``<run_id>/weights/<version>``) and never name a file,
  so ``/`` and ``:`` are allowed: 1 to 512 of ``A-Z a-z 0-9 . _ - : / @ + = ~``, starting with a
  letter or digit.
* :data:`FILE_NAME` -- a file the caller names inside a folder the service chooses (an export):
  the :data:`ID` characters and length.
* :data:`PATH` -- paths and URIs on the service's side (``config_path``, ``uri``): no NUL and no
  other control character, at most 4096 bytes (Linux ``PATH_MAX``).
* :data:`TEXT` -- free text (a cancel reason, a model name, a command word): no NUL (PostgreSQL
  text and ``execve`` refuse it), bounded.

Lengths are UTF-8 bytes, so an error never has to echo an oversized value and a value always
fits in status metadata (clients cap metadata at 8 KiB).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from openforge_core.errors import FieldViolation, InvalidArgument


@dataclass(frozen=True)
class FieldRule:
    """What one kind of string field may hold.

    Attributes:
        max_bytes: Longest value, in UTF-8 bytes.
        pattern: The whole value must match (``re.fullmatch``).
        allows: What the rule allows, for a human (the violation's description).
    """

    max_bytes: int
    pattern: re.Pattern[str]
    allows: str

    def violation(self, field: str, value: str) -> FieldViolation | None:
        """The violation of a non-empty ``value`` of ``field``, or None if it is valid.

        The description never echoes the value (it may be megabytes, or unprintable).
        """
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > self.max_bytes:
            return FieldViolation(field, f"longer than {self.max_bytes} bytes ({size}); must be {self.allows}")
        if "\x00" in value:
            return FieldViolation(field, f"contains a NUL character; must be {self.allows}")
        if not self.pattern.fullmatch(value):
            return FieldViolation(field, f"must be {self.allows}")
        return None


ID = FieldRule(
    max_bytes=128,
    pattern=re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*"),
    allows="1 to 128 of A-Z a-z 0-9 . _ -, starting with a letter or digit",
)
KEY = FieldRule(
    max_bytes=512,
    pattern=re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+=~-]*"),
    allows="1 to 512 of A-Z a-z 0-9 . _ - : / @ + = ~, starting with a letter or digit",
)
FILE_NAME = FieldRule(
    max_bytes=128,
    pattern=ID.pattern,
    allows="a file name: 1 to 128 of A-Z a-z 0-9 . _ -, starting with a letter or digit (no folders)",
)
PATH = FieldRule(
    max_bytes=4096,
    pattern=re.compile(r"[^\x00-\x1f\x7f]+"),
    allows="a path of at most 4096 bytes without NUL or other control characters",
)


def _text(max_bytes: int) -> FieldRule:
    return FieldRule(
        max_bytes=max_bytes,
        pattern=re.compile(r"[^\x00]*", re.DOTALL),
        allows=f"text of at most {max_bytes} bytes without NUL",
    )


#: Free text of any field the table does not name.
TEXT = _text(64 * 1024)

#: The rule of each string field of a request, by field name (the last part of its path).
FIELD_RULES: Mapping[str, FieldRule] = {
    "run_id": ID,
    "rollout_id": ID,
    "group_id": ID,
    "task_id": ID,
    "task_set": ID,
    "harness": ID,
    "request_id": KEY,
    "file_name": FILE_NAME,
    "config_path": PATH,
    "uri": PATH,
    "model_name": _text(512),
    "checksum": _text(256),
    "cursor": _text(256),
    "page_token": _text(4096),
    "reason": _text(4096),
}


def rule_for(field_name: str) -> FieldRule:
    """The rule of a string field named ``field_name`` (:data:`TEXT` if the table has none)."""
    return FIELD_RULES.get(field_name, TEXT)


def _strings(message: Message, prefix: str) -> Iterator[tuple[str, str, str]]:
    """(field path, field name, value) of every non-empty string in ``message``, recursively.

    Well-known types (``google.protobuf.Struct``, ``Duration``...) are not walked: a Struct is
    free-form data its service validates as a whole.
    """
    for fd, value in message.ListFields():
        path = f"{prefix}{fd.name}"
        if fd.type == FieldDescriptor.TYPE_STRING:
            items = enumerate(value) if fd.is_repeated else [(None, value)]
            for i, item in items:
                if item:
                    yield (path if i is None else f"{path}[{i}]"), fd.name, item
        elif fd.type == FieldDescriptor.TYPE_MESSAGE and fd.message_type is not None:
            if fd.message_type.full_name.startswith("google.protobuf."):
                continue
            if fd.message_type.GetOptions().map_entry:
                for key, item in value.items():
                    if isinstance(key, str):
                        yield f"{path}[key]", "", key
                    if isinstance(item, str):
                        yield f"{path}[{key!r}]", "", item
                    elif isinstance(item, Message):
                        yield from _strings(item, f"{path}[{key!r}].")
            elif fd.is_repeated:
                for i, item in enumerate(value):
                    yield from _strings(item, f"{path}[{i}].")
            else:
                yield from _strings(value, f"{path}.")


def violations(message: Message) -> list[FieldViolation]:
    """Every string field of ``message`` that breaks its rule (empty fields are not checked).

    Args:
        message: A decoded request.

    Returns:
        The violations, in field order; empty if every field is valid.
    """
    found: list[FieldViolation] = []
    for path, name, value in _strings(message, ""):
        v = rule_for(name).violation(path, value)
        if v is not None:
            found.append(v)
    return found


def invalid(found: list[FieldViolation]) -> InvalidArgument:
    """One INVALID_ARGUMENT listing ``found`` (message: ``"<field>: <why>; ..."``)."""
    return InvalidArgument(
        "; ".join(f"{v.field}: {v.description}" for v in found), reason="INVALID_FIELD", violations=found
    )


def check_message(message: Message) -> None:
    """Raises if any string field of ``message`` breaks its rule.

    Raises:
        InvalidArgument: Listing every violation.
    """
    found = violations(message)
    if found:
        raise invalid(found)


def check(field: str, value: str, *, required: bool = True) -> str:
    """Returns ``value`` if it is valid for ``field`` (by the last part of its path).

    Args:
        field: Field path, e.g. ``"run_id"`` or ``"tasks[0].task_id"``.
        value: The value.
        required: Whether an empty value is refused.

    Raises:
        InvalidArgument: Empty but required, or breaking the field's rule.
    """
    if not value:
        if required:
            raise InvalidArgument.field(field, "is required", reason="INVALID_FIELD")
        return value
    name = field.rsplit(".", 1)[-1].split("[", 1)[0]
    v = rule_for(name).violation(field, value)
    if v is not None:
        raise invalid([v])
    return value


def require(message: Message, *fields: str) -> None:
    """Raises if any of the named top-level string fields of ``message`` is empty.

    Args:
        message: A decoded request.
        fields: Names of its string fields that must be set.

    Raises:
        InvalidArgument: Listing every empty one.
    """
    found = [FieldViolation(f, "is required") for f in fields if not getattr(message, f)]
    if found:
        raise invalid(found)
