"""Reading and validating a run config (the schema: :mod:`openforge_core.run_config`).

A run config is given inline (``StartRunRequest.config``) or as a file (``config_path``: JSON or
YAML), or both (inline fields override the file's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from openforge_core.errors import FieldViolation, InvalidArgument
from openforge_core.run_config import RunConfig


def read_config_file(path: Path) -> dict[str, Any]:
    """Reads a run config file: ``.json``, or ``.yaml``/``.yml``.

    Raises:
        InvalidArgument: The file is missing, unreadable or not a mapping.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidArgument.field("config_path", f"cannot read {path}: {exc.strerror}") from exc
    data: Any
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InvalidArgument.field("config_path", f"{path} does not parse: {exc}") from exc
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InvalidArgument.field("config_path", f"{path} does not parse: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidArgument.field("config_path", f"{path} must hold a mapping of config fields")
    return data


def parse_run_config(data: dict[str, Any]) -> RunConfig:
    """Validates a config mapping.

    Raises:
        InvalidArgument: With one field violation per invalid field.
    """
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        violations = [
            FieldViolation(".".join(str(p) for p in err["loc"]) or "config", err["msg"]) for err in exc.errors()
        ]
        summary = "; ".join(f"{v.field}: {v.description}" for v in violations)
        raise InvalidArgument(f"run config does not validate: {summary}", violations=violations) from None
