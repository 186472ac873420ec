"""Renders every service's settings class to ``docs/configuration.md`` (the configuration reference).

Each service reads its settings once from ``OPENFORGE_*`` environment variables (pydantic-settings,
``__`` between nested fields). This walks each settings class and its nested sections and writes one
table per service: the variable, its type, its default and its description. Descriptions come from
the ``Attributes:`` section of each class's docstring (the project's docstring convention), so the
reference cannot drift from the code: ``--check`` exits 1 when the checked-in file differs from a
fresh rendering (the test suite runs it).

Usage::

    python tools/gen_settings_docs.py            # write docs/configuration.md
    python tools/gen_settings_docs.py --check    # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "configuration.md"
PREFIX = "OPENFORGE_"
SEP = "__"

#: (service, "module:Class") in the order the README lists the services.
SERVICES: tuple[tuple[str, str], ...] = (
    ("proxy", "openforge_proxy.settings:ProxySettings"),
    ("orchestrator", "openforge_orchestrator.settings:OrchestratorSettings"),
    ("trajectory-store", "openforge_trajectory_store.settings:StoreSettings"),
    ("inference", "openforge_inference.settings:InferenceSettings"),
    ("trainer", "openforge_trainer.settings:TrainerSettings"),
)
COMMON = "openforge_core.settings:ServiceSettings"

_ATTR = re.compile(r"^(\s*)([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(.*)$")


def attribute_docs(cls: type) -> dict[str, str]:
    """``{field: description}`` from the ``Attributes:`` sections of ``cls`` and its bases.

    A description runs from ``name: text`` to the next line indented like ``name`` (or less);
    continuation lines are joined with spaces.
    """
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = inspect.getdoc(klass) if klass.__doc__ else None
        if not doc or "Attributes:" not in doc:
            continue
        lines = doc.split("Attributes:", 1)[1].splitlines()
        name, indent = "", -1
        parts: list[str] = []
        for line in lines[1:]:
            if not line.strip():
                continue
            m = _ATTR.match(line)
            level = len(line) - len(line.lstrip())
            if indent < 0:
                indent = level
            if level < indent:
                break
            if m and level == indent:
                if name:
                    out[name] = " ".join(parts)
                name, parts = m.group(2), [m.group(3).strip()]
            elif name:
                parts.append(line.strip())
        if name:
            out[name] = " ".join(parts)
    return out


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation) if a is not Ellipsis)
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "(required)"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value is None or value == "" or value == () or value == [] or value == {}:
        return "`" + ("none" if value is None else repr(value)) + "`"
    return f"`{value}`"


def _section(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def rows(cls: type[BaseModel], path: tuple[str, ...] = (), skip: set[str] | None = None) -> list[tuple[str, ...]]:
    """Table rows (variable, type, default, description) of ``cls``'s fields, sections expanded."""
    docs = attribute_docs(cls)
    summary = (inspect.getdoc(cls) or "").split("\n\n", 1)[0] if "Attributes:" not in (cls.__doc__ or "") else ""
    out: list[tuple[str, ...]] = []
    for name, field in cls.model_fields.items():
        if skip and not path and name in skip:
            continue
        var = PREFIX + SEP.join(p.upper() for p in (*path, name))
        section = _section(field.annotation)
        if section is not None:
            out.extend(rows(section, (*path, name)))
            continue
        desc = " ".join((docs.get(name) or summary).split()).replace("|", "\\|").replace("``", "`")
        out.append((f"`{var}`", _type_name(field.annotation), _default(field), desc))
    return out


def _load(target: str) -> type[BaseModel]:
    module, _, name = target.partition(":")
    cls: type[BaseModel] = getattr(importlib.import_module(module), name)
    return cls


def _table(lines: list[str], body: list[tuple[str, ...]]) -> None:
    lines.append("| variable | type | default | description |")
    lines.append("|---|---|---|---|")
    lines.extend("| " + " | ".join(r) + " |" for r in body)
    lines.append("")


def render() -> str:
    """The whole ``docs/configuration.md`` text."""
    common = _load(COMMON)
    common_fields = set(common.model_fields)
    lines = [
        "# Configuration reference",
        "",
        "<!-- GENERATED by tools/gen_settings_docs.py from the settings classes; do not edit. -->",
        "",
        "Every service reads its settings once at start from environment variables: the prefix",
        f"`{PREFIX}`, and `{SEP}` between a section and its field (`OPENFORGE_GRPC__PORT=50051`).",
        'Unknown fields are refused. Lists and tuples take JSON (`\'["a", "b"]\'`). Telemetry export',
        "uses the standard `OTEL_*` variables. `openforge up` / `openforge train` set the",
        "addresses, ports and paths below for the processes they start.",
        "",
        "## Every service",
        "",
    ]
    _table(lines, rows(common))
    for service, target in SERVICES:
        cls = _load(target)
        lines += [f"## {service}", "", f"`{target.replace(':', '.')}`", ""]
        body = rows(cls, skip=common_fields)
        if body:
            _table(lines, body)
        else:
            lines += ["Only the settings every service has.", ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    """Writes ``docs/configuration.md``, or with ``--check`` exits 1 if it is stale."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the checked-in file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUT.read_text(encoding="utf-8") if OUT.is_file() else ""
        if current != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run python tools/gen_settings_docs.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
