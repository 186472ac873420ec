"""Proxy settings (``OPENFORGE_`` environment variables)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from openforge_core.settings import ServiceSettings, SettingsSection


class HttpSettings(SettingsSection):
    """The harness-facing HTTP server (``OPENFORGE_HTTP__*``).

    Attributes:
        host: Interface to bind; ``0.0.0.0`` in a container.
        port: TCP port; 0 picks a free one (logged as ``http.started``).
        max_body_bytes: Largest request body after decompression, bytes
            (Claude Code's bodies are about 50-160 KB; long sessions grow). Checked while
            the body is read: a larger one is refused (413) before it is parsed.
        header_timeout_s: Most seconds for a request's line and headers to arrive, from its
            first byte (from the connection's opening for its first request); the connection
            is closed after (408). 0 = no limit. Idle kept-alive connections are not affected.
        body_timeout_s: Most seconds for a request's whole body to arrive once its headers
            did (408 after, and the connection is closed). 0 = no limit.
    """

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    header_timeout_s: float = Field(default=10.0, ge=0)
    body_timeout_s: float = Field(default=60.0, ge=0)


class LargeBodySettings(SettingsSection):
    """Large request bodies (``OPENFORGE_LARGE_BODY__*``).

    Attributes:
        process: Parse bodies from ``min_bytes`` in a separate process
            (``openforge_proxy.adapters.body_parser``), so that other sessions' calls are
            served meanwhile: JSON parsing holds the interpreter for the whole of a body (about
            100-300 ms for 30 MiB), in a worker thread too. Such a body is converted without the
            session's parse memos (same result; a session sending bodies this large parses each
            whole), and one whose prompt text alone cannot fit the context is refused there
            (``domain.screen``): only the refusal comes back, the proxy never builds the body's
            strings. False: every body is parsed in the proxy's process (from 1 MiB in a worker
            thread), as the reference path does.
        min_bytes: Smallest body parsed in that process, bytes (after decompression).
        timeout_s: Most seconds a body may take in that process; then it is killed (a new one
            is started for the next body) and the body is parsed in the proxy's.
    """

    process: bool = True
    min_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    timeout_s: float = Field(default=30.0, gt=0)


class ModelSettings(SettingsSection):
    """How the proxy uses the served model (``OPENFORGE_MODEL__*``).

    Attributes:
        path: Where this process reads the model directory (for
            ``tokenizer.json``); empty = the ``model_path`` inference reports
            (one machine, or a shared volume).
        family: Chat-template family: ``auto`` detects it from the template, or ``hermes``
            (Qwen2.5, Qwen3), ``llama3`` (Llama 3.1+ JSON tool calls), ``glm45`` (GLM-4.5
            ``<arg_key>``/``<arg_value>`` tool calls), ``mistral`` (Mistral Small 3.x, Devstral:
            v11 ``[TOOL_CALLS]NAME[ARGS]{...}`` tool calls), ``deepseek_v31`` (DeepSeek-V3.1:
            ``<｜tool▁calls▁begin｜>`` blocks of calls).
        template_kwargs: Extra chat-template variables, e.g.
            ``{"enable_thinking": false}``, or ``{"thinking": true}`` for DeepSeek-V3.1's
            thinking mode (JSON in the environment).
        check_tokenizer_hash: Refuse a tokenizer that differs from inference's.
    """

    path: str = ""
    family: str = "auto"
    template_kwargs: dict[str, Any] = Field(default_factory=dict)
    check_tokenizer_hash: bool = True


class RecordSettings(SettingsSection):
    """Call records (``OPENFORGE_RECORD__*``).

    Attributes:
        structs: Also fill the ``request``/``canonical_messages`` Struct fields
            (the bytes fields always hold them; Structs cost about 1 ms per
            100 KB of body).
    """

    structs: bool = False


class ProxySettings(ServiceSettings):
    """Settings of the proxy.

    Attributes:
        session_ttl_s: Default lifetime of a session key, seconds
            (``OPENFORGE_SESSION_TTL_S``).
        max_sessions: Most open sessions kept at once.
        max_ended_sessions: Most closed or expired sessions remembered (the most recently
            ended; older ones are forgotten, so memory does not grow with rollouts served).
        http: The harness-facing HTTP server.
        large_body: Large request bodies.
        model: How the served model is used.
        record: Call records.
        max_heads: Conversation views kept per session for splicing (main
            agent, sub-agents, retries).
        default_max_tokens: Completion cap when neither the harness nor the
            session gives one.
        generate_timeout_s: Deadline of one generation stream, seconds.
        gc_tuning: Once the model is loaded, freeze what is alive and make
            cyclic garbage collections rarer (``app.tune_gc``).
        memos: Reuse what a session's earlier calls computed (parsed bodies, converted
            conversations, the splicer's matches, renders and encoded chunks). False: every
            call is computed whole, the reference path (the same answers and records, more CPU).
    """

    service_name: ClassVar[str] = "proxy"

    session_ttl_s: float = Field(default=3600.0, gt=0)
    max_sessions: int = Field(default=100_000, gt=0)
    max_ended_sessions: int = Field(default=256, ge=0)
    http: HttpSettings = HttpSettings()
    large_body: LargeBodySettings = LargeBodySettings()
    model: ModelSettings = ModelSettings()
    record: RecordSettings = RecordSettings()
    max_heads: int = Field(default=4, ge=1)
    default_max_tokens: int = Field(default=4096, ge=1)
    generate_timeout_s: float = Field(default=900.0, gt=0)
    gc_tuning: bool = True
    memos: bool = True
