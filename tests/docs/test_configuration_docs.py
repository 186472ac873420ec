"""docs/configuration.md is generated from the settings classes and must match them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_settings_docs", ROOT / "tools" / "gen_settings_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_checked_in_configuration_reference_is_fresh() -> None:
    tool = _tool()
    fresh = tool.render()
    current = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert current == fresh, "docs/configuration.md is stale: run python tools/gen_settings_docs.py"
    assert tool.main(["--check"]) == 0


def test_reference_lists_every_field_of_every_service_with_its_env_var() -> None:
    tool = _tool()
    text = tool.render()
    for service, target in tool.SERVICES:
        assert f"## {service}" in text
        cls = tool._load(target)
        for name, field in cls.model_fields.items():
            if tool._section(field.annotation) is None:
                assert f"`OPENFORGE_{name.upper()}`" in text, (service, name)
    # nested sections use __, and descriptions come from the docstrings
    assert "`OPENFORGE_SANDBOX__LOCAL__BWRAP`" in text and "`OPENFORGE_GRPC__PORT`" in text
    assert "| TCP port; 0 picks a free port" in text


def test_attribute_docs_reads_google_style_attributes_with_continuations() -> None:
    tool = _tool()

    class Example:
        """Summary.

        Attributes:
            a: First line
                and its continuation.
            b: Second.

        Notes:
            c: not an attribute.
        """

    assert tool.attribute_docs(Example) == {"a": "First line and its continuation.", "b": "Second."}
