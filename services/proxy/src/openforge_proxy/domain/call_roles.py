"""Call roles: what a model call is for, decided from the request alone.

Real harnesses make calls that are not the policy acting on the task. The proxy
classifies each call, with no harness change, from what the request carries:

* ``side`` — a request to a probe path (token counting, model listing), or one
  that offers no tools and asks for a title/topic (Claude Code's per-session
  "generate a concise title" call) or is a one-token quota probe.
* ``compaction`` — a summarising request whose answer replaces the history
  (Claude Code's "create a detailed summary of the conversation", Codex's
  context-checkpoint compaction and its ``/responses/compact`` endpoint).
* ``main`` / ``sub_agent`` — every other call belongs to a *lineage*: a call
  whose message history extends an earlier call's (the earlier call's messages
  are a prefix of its own) continues that call's lineage; one that extends none
  starts a new lineage. A new lineage with the system prompt and tool set of the
  session's first lineage is ``main`` (the history was rewritten, e.g. after a
  compaction); one with another system prompt or tool set is a ``sub_agent``
  (Claude Code's Task tool runs its own conversation in the same session).

Message comparison ignores system messages (compared as the lineage's
signature instead), tool-call ids (OpenClaw rewrites them) and OpenClaw's
ephemeral ``<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>`` message (moved to the end
of every request). Retries send the same history and stay in their lineage.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field

from openforge_proxy.domain.conversation import CanonicalRequest, Message


class CallRole(enum.Enum):
    """What a model call is for."""

    MAIN = "main"
    SUB_AGENT = "sub_agent"
    COMPACTION = "compaction"
    SIDE = "side"


#: Paths of requests that are never the policy acting (probes).
SIDE_PATH_SUFFIXES = ("/count_tokens", "/models")
#: Paths whose request is a compaction whatever it carries (Codex's remote compaction).
COMPACTION_PATH_SUFFIXES = ("/responses/compact", "/compact")
#: Markers (lower-cased) of a title/topic request: it asks for a short label, not an action.
TITLE_MARKERS = (
    "concise title",
    "generate a title",
    "sentence-case title",
    "title for this conversation",
    "title for the conversation",
    "summarize this coding conversation in under",
    "new conversation topic",
    "isnewtopic",
)
#: Markers (lower-cased) of a compaction request: it asks for a summary replacing the history.
COMPACTION_MARKERS = (
    "detailed summary of the conversation",
    "summary of the conversation so far",
    "summarize the conversation",
    "context checkpoint compaction",
    "handoff summary",
    "your task is to create a detailed summary",
    "compact the conversation",
)
#: OpenClaw's per-request context message (moved to the end of each request).
OPENCLAW_CONTEXT_MARKER = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"
#: A request asking for at most this many tokens, with no tools, is a probe (quota check).
PROBE_MAX_TOKENS = 1


@dataclass(frozen=True)
class CallClass:
    """A call's role and, for main and sub-agent calls, its lineage.

    Attributes:
        role: What the call is for.
        lineage_id: The lineage (``l0``, ``l1``...: in order of appearance in the session);
            empty for side and compaction calls.
        lineage_index: The lineage's position in the session (``-1`` when none).
    """

    role: CallRole
    lineage_id: str = ""
    lineage_index: int = -1


def _system_text(req: CanonicalRequest) -> str:
    """The leading system messages (the agent's prompt; later ones are per-turn context)."""
    lead: list[str] = []
    for m in req.messages:
        if m.role != "system":
            break
        lead.append(m.content)
    return "\n".join(lead)


def _lower_texts(req: CanonicalRequest) -> tuple[str, str]:
    """The system prompt and the last user message, lower-cased: where harnesses put their
    title and compaction instructions."""
    last_user = next((m.content for m in reversed(req.messages) if m.role == "user"), "")
    return _system_text(req).lower(), last_user.lower()


def _has(texts: tuple[str, str], markers: tuple[str, ...]) -> bool:
    return any(k in t for t in texts for k in markers)


def _message_key(m: Message) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(m.role.encode())
    h.update(b"\0")
    h.update(" ".join(m.content.split()).encode())
    for tc in m.tool_calls:
        h.update(b"\0tc:")
        h.update(tc.name.encode())
    return h.digest()


def history_keys(req: CanonicalRequest) -> tuple[bytes, ...]:
    """The request's conversation as comparable keys: system messages and OpenClaw's context
    message left out, tool-call ids and whitespace ignored."""
    return tuple(
        _message_key(m) for m in req.messages if m.role != "system" and OPENCLAW_CONTEXT_MARKER not in m.content
    )


def signature(req: CanonicalRequest) -> bytes:
    """What sets an agent apart within a session: its system prompt and the tools it offers."""
    h = hashlib.blake2b(digest_size=16)
    h.update(" ".join(_system_text(req).split()).encode())
    for t in sorted(t.name for t in req.tools):
        h.update(b"\0")
        h.update(t.encode())
    return h.digest()


def static_role(req: CanonicalRequest, path: str = "") -> CallRole | None:
    """The role the request shows by itself (``side`` or ``compaction``), or None for a call
    whose role depends on its lineage."""
    p = path.split("?", 1)[0].rstrip("/")
    if p.endswith(COMPACTION_PATH_SUFFIXES):
        return CallRole.COMPACTION
    if p.endswith(SIDE_PATH_SUFFIXES):
        return CallRole.SIDE
    texts = _lower_texts(req)
    if _has(texts, COMPACTION_MARKERS):
        return CallRole.COMPACTION
    if not req.tools:
        if _has(texts, TITLE_MARKERS):
            return CallRole.SIDE
        if req.max_tokens is not None and req.max_tokens <= PROBE_MAX_TOKENS:
            return CallRole.SIDE
    return None


@dataclass
class _Lineage:
    index: int
    signature: bytes
    #: The longest history seen in this lineage (the keys of its latest call).
    history: tuple[bytes, ...]


@dataclass
class LineageTracker:
    """One session's lineages; :meth:`classify` each call in arrival order."""

    lineages: list[_Lineage] = field(default_factory=list)

    def classify(self, req: CanonicalRequest, path: str = "") -> CallClass:
        """The call's role and lineage; main and sub-agent calls update the lineages."""
        role = static_role(req, path)
        if role is not None:
            return CallClass(role)
        keys = history_keys(req)
        sig = signature(req)
        lineage = self._extended(keys, sig)
        if lineage is None:
            lineage = _Lineage(len(self.lineages), sig, keys)
            self.lineages.append(lineage)
        elif len(keys) >= len(lineage.history):
            lineage.history = keys
        main_sig = self.lineages[0].signature
        role = CallRole.MAIN if lineage.signature == main_sig else CallRole.SUB_AGENT
        return CallClass(role, f"l{lineage.index}", lineage.index)

    def _extended(self, keys: tuple[bytes, ...], sig: bytes) -> _Lineage | None:
        """The lineage this history continues: the latest whose history is a prefix of it (or
        that it is a prefix of: a retry after a longer call), with the same signature."""
        for lin in reversed(self.lineages):
            if lin.signature != sig or not keys or not lin.history:
                continue
            n = min(len(keys), len(lin.history))
            if keys[:n] == lin.history[:n]:
                return lin
        return None
