"""The lazy registry imports a target only when it is loaded and names the known entries when
asked for an unknown one."""

from __future__ import annotations

import sys

import pytest

from openforge_core.registry import LazyRegistry, UnknownName


def test_a_target_is_imported_on_first_load_only() -> None:
    sys.modules.pop("json.tool", None)
    registry = LazyRegistry("formatter", {"json": "json.tool:main", "csv": "csv:writer"})
    assert "json.tool" not in sys.modules  # registering imports nothing
    assert registry.load("json") is sys.modules["json.tool"].main
    assert registry.names() == ["csv", "json"] and "csv" in registry and len(registry) == 2


def test_an_unknown_name_is_a_key_error_naming_the_known_ones() -> None:
    registry = LazyRegistry("sandbox backend", {"local": "os:getcwd", "kubernetes": "os:getpid"})
    with pytest.raises(KeyError) as err:
        registry.load("docker")
    assert isinstance(err.value, UnknownName)
    assert str(err.value) == "unknown sandbox backend 'docker'; known: kubernetes, local"


def test_a_target_without_an_attribute_is_refused_when_registered() -> None:
    with pytest.raises(ValueError, match="'x' is not 'module:attribute'"):
        LazyRegistry("engine", {"vllm": "x"})
    with pytest.raises(ModuleNotFoundError):
        LazyRegistry("engine", {"gone": "no_such_module_here:Engine"}).load("gone")
