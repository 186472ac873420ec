"""The ``miniwob`` task family: small MiniWoB-style web pages whose verifier reads the final page.

Every instance is a Harbor task folder (``task.toml``, ``instruction.md``, ``environment/files/
index.html``, ``tests/``). The page records what the agent did in ``data-*`` attributes of its
``<body>`` (MiniWoB's pages compute their reward in page script in the same way); only the first
submission counts, so a wrong action cannot be taken back. The browser harness writes the final
page state to ``/app/page_state.json`` (:data:`STATE_FILE`); ``tests/check.py`` reads it and
writes ``reward.json``: 1.0 when the recorded outcome is the expected one, else 0.0.

=====================  ================================================  ==========================
kind                   instruction                                       the page records
=====================  ================================================  ==========================
``click-button``       Click the button labelled "W".                    ``data-clicked``: label
``enter-text``         Type "W" into the text field and press Submit.    ``data-submitted``: text
``click-checkboxes``   Select "A" and "B", then press Submit.            ``data-submitted``: labels
=====================  ================================================  ==========================

Instances are drawn reproducibly from a seed and split into disjoint ``train`` and ``test`` sets
(``test_per_kind`` of each kind held out).
"""

from __future__ import annotations

import html
import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

#: Words used as labels and texts.
WORDS: Final[tuple[str, ...]] = (
    "city", "light", "rain", "page", "map", "tab", "root", "hand", "plan", "square", "branch", "server",
)  # fmt: skip
#: The page's file name inside the task's workspace.
PAGE_FILE: Final = "index.html"
#: Where the harness writes the final page state inside the task's workspace.
STATE_FILE: Final = "page_state.json"

Kind = Literal["click-button", "enter-text", "click-checkboxes"]
KINDS: Final[tuple[Kind, ...]] = ("click-button", "enter-text", "click-checkboxes")


@dataclass(frozen=True)
class Instance:
    """One task of the family.

    Attributes:
        kind: One of :data:`KINDS`.
        index: Its number within its kind (0-based).
        choices: The labels on the page, in page order.
        target: The labels the instruction asks for (one, except for ``click-checkboxes``).
    """

    kind: Kind
    index: int
    choices: tuple[str, ...]
    target: tuple[str, ...]

    @property
    def task_id(self) -> str:
        """``<kind>-<index>``."""
        return f"{self.kind}-{self.index}"

    @property
    def instruction(self) -> str:
        """The prompt the harness gets."""
        if self.kind == "click-button":
            return f'Click the button labelled "{self.target[0]}".'
        if self.kind == "enter-text":
            return f'Type "{self.target[0]}" into the text field and press Submit.'
        return " and ".join(f'"{t}"' for t in self.target).join(("Select ", ", then press Submit."))

    @property
    def expected(self) -> dict[str, str]:
        """The body ``data-*`` values (camel-cased, as ``dataset`` gives them) a success leaves."""
        if self.kind == "click-button":
            return {"clicked": self.target[0]}
        if self.kind == "enter-text":
            return {"submitted": self.target[0]}
        # as the page's JSON.stringify writes it: no spaces
        return {"submitted": json.dumps(sorted(self.target), separators=(",", ":"))}


def instances(per_kind: int = 6, seed: int = 0) -> list[Instance]:
    """``per_kind`` instances of each kind, drawn reproducibly from ``seed``."""
    rng = random.Random(f"miniwob-family:{seed}")
    out: list[Instance] = []
    for kind in KINDS:
        for i in range(per_kind):
            choices = tuple(rng.sample(WORDS, rng.randint(3, 5)))
            if kind == "enter-text":
                out.append(Instance(kind, i, (), (rng.choice(WORDS),)))
            elif kind == "click-button":
                out.append(Instance(kind, i, choices, (rng.choice(choices),)))
            else:
                out.append(Instance(kind, i, choices, tuple(rng.sample(choices, 2))))
    return out


def split(items: list[Instance], seed: int, test_per_kind: int = 2) -> dict[str, list[Instance]]:
    """Disjoint ``train``/``test`` sets: ``test_per_kind`` held-out instances of each kind.

    Raises:
        ValueError: ``test_per_kind`` leaves a kind without training instances.
    """
    rng = random.Random(f"miniwob-split:{seed}")
    test: list[Instance] = []
    for kind in KINDS:
        pool = [i for i in items if i.kind == kind]
        if not 1 <= test_per_kind < len(pool):
            raise ValueError(f"test_per_kind={test_per_kind}: kind {kind} has {len(pool)} instances")
        test += rng.sample(pool, test_per_kind)
    return {"train": [i for i in items if i not in test], "test": [i for i in items if i in test]}


_PAGE: Final = """\
<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title></head>
<body>
<h1>{title}</h1>
<div id="area">
{body}
</div>
<script>
{script}
</script>
</body></html>
"""

_SUBMIT_ONCE: Final = """\
function record(key, value) {
  if (!(key in document.body.dataset)) document.body.dataset[key] = value;
}
"""


def page_html(inst: Instance) -> str:
    """The task's page (self-contained: no network, no external script)."""
    esc = html.escape
    if inst.kind == "click-button":
        body = "\n".join(f'<button type="button" class="choice">{esc(c)}</button>' for c in inst.choices)
        script = (
            _SUBMIT_ONCE
            + "for (const b of document.querySelectorAll('button.choice'))\n"
            + "  b.addEventListener('click', () => record('clicked', b.textContent));\n"
        )
    elif inst.kind == "enter-text":
        body = (
            '<form id="f"><label for="answer">Answer</label> <input id="answer" type="text">\n'
            '<button type="submit">Submit</button></form>'
        )
        script = (
            _SUBMIT_ONCE + "document.getElementById('f').addEventListener('submit', (e) => {\n"
            "  e.preventDefault(); record('submitted', document.getElementById('answer').value.trim());\n});\n"
        )
    else:
        boxes = "\n".join(
            f'<div><input type="checkbox" id="c{i}" value="{esc(c)}"><label for="c{i}">{esc(c)}</label></div>'
            for i, c in enumerate(inst.choices)
        )
        body = f'<form id="f">\n{boxes}\n<button type="submit">Submit</button></form>'
        script = (
            _SUBMIT_ONCE + "document.getElementById('f').addEventListener('submit', (e) => {\n"
            "  e.preventDefault();\n"
            "  const on = Array.from(document.querySelectorAll('input:checked')).map((c) => c.value).sort();\n"
            "  record('submitted', JSON.stringify(on));\n});\n"
        )
    return _PAGE.format(title=esc(inst.kind.replace("-", " ")), body=body, script=script)


_TASK_TOML: Final = """\
version = "1.0"

[metadata]
author_name = "OpenForgeRL"
difficulty = "easy"
category = "miniwob"
tags = ["openforge-miniwob", "browser", "{split}"]

[agent]
timeout_sec = 120.0

[verifier]
timeout_sec = 30.0

[environment]
cpus = 1
memory_mb = 2048
storage_mb = 64
allow_internet = false
"""

_TEST_SH: Final = """\
#!/usr/bin/env bash
# Verifier of a `miniwob` task: check.py reads the final page state, writes /logs/verifier/reward.json.
set -u
mkdir -p /logs/verifier
python3 /tests/check.py /app/{state} /logs/verifier/reward.json
"""

_CHECK_PY: Final = '''\
"""Verifier of a `miniwob` task: 1.0 when the final page recorded the expected outcome, else 0.0.

Usage: check.py STATE_JSON REWARD_JSON (the harness's episode record; where to write the reward).
"""

import json
import sys
from pathlib import Path

EXPECTED = {expected}
state_path, reward_path = Path(sys.argv[1]), Path(sys.argv[2])
try:
    data = json.loads(state_path.read_text())["page"]["data"]
except (OSError, ValueError, KeyError, TypeError):
    data = None
right = isinstance(data, dict) and all(data.get(k) == v for k, v in EXPECTED.items())
print(f"page data: {{data}}; expected: {{EXPECTED}}")
reward_path.write_text(json.dumps({{"reward": 1.0 if right else 0.0, "state_found": int(data is not None)}}))
'''


def write_task(inst: Instance, folder: Path, split_name: str) -> None:
    """Writes one Harbor task folder for ``inst`` (replacing any folder already there)."""
    if folder.exists():
        shutil.rmtree(folder)
    files = folder / "environment" / "files"
    files.mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "task.toml").write_text(_TASK_TOML.format(split=split_name))
    (folder / "instruction.md").write_text(inst.instruction + "\n")
    (files / PAGE_FILE).write_text(page_html(inst))
    # The workspace only: Chromium comes with the harness (Debian's, from the host or the
    # harness image), not from the task.
    (folder / "environment" / "Dockerfile").write_text(
        "FROM python:3.11-slim-bookworm\nWORKDIR /app\nCOPY files/ /app/\n"
    )
    (folder / "tests" / "test.sh").write_text(_TEST_SH.format(state=STATE_FILE))
    (folder / "tests" / "check.py").write_text(_CHECK_PY.format(expected=json.dumps(inst.expected)))
    (folder / "tests" / "test.sh").chmod(0o755)


def generate(out: Path, seed: int = 0, test_per_kind: int = 2) -> dict[str, list[str]]:
    """Writes the family under ``out/train`` and ``out/test`` (each folder replaced whole).

    Returns:
        Task ids per split, in the family's order.
    """
    sets = split(instances(seed=seed), seed, test_per_kind)
    ids: dict[str, list[str]] = {}
    for split_name, items in sets.items():
        root = out / split_name
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        for inst in items:
            write_task(inst, root / inst.task_id, split_name)
        ids[split_name] = [i.task_id for i in items]
    return ids
