"""``openforge tasks``: the ``words`` task family, small enough for a tiny model to learn on a CPU.

Every instance is a Harbor task folder (``task.toml``, ``instruction.md``, ``environment/``,
``tests/``, ``solution/solve.sh``) whose answer is one word of a small vocabulary (:data:`WORDS`).
Three kinds share the skill "read a name, act on it":

==========  =====================================================  ===============================
kind        instruction                                            oracle (one model call a line)
==========  =====================================================  ===============================
``touch``   Create an empty file named ``W``.                      ``touch W``
``mkdir``   Create a directory named ``W``.                        ``mkdir W``
``note``    The file ``N.txt`` holds a name; create an empty       ``cat N.txt`` then ``touch W``
            file with that name.                                   (W is read from the tool result)
==========  =====================================================  ===============================

Each ``note`` instance has a note file of its own (:data:`NOTE_NAMES`, one per instance, its
answer drawn from :data:`WORDS` in turn), so every instance has its own instruction (the
``scripted-oracle`` engine finds a task by its instruction) and a held-out note names an answer
that its note name never led to in training.

The verifier (``tests/check.py``) gives gated partial credit, written to ``reward.json``: 0.5
for the right kind of action (exactly one new entry in ``/app``, of the asked type: file or
directory), 1.0 when its name is also right. Anything else (no new entry, several, the wrong type)
earns 0, so spraying every name earns nothing. A policy that has only learnt the format earns
about ``0.5 + 0.5 / len(WORDS)`` on ``touch``/``mkdir`` when it picks the command right, which
gives GRPO groups reward variance from the first step.

Instances are split reproducibly into disjoint ``train`` and ``test`` sets (:func:`split`): the
held-out instances are (kind, word) pairs never trained on, every word and every kind still
appearing in ``train``, so the test measures the skill, not a memorised answer.

``solution/solve.sh`` starts with :data:`ONE_CALL_PER_LINE`: the ``scripted-oracle`` engine then
replays each command line as its own model call (so the ``note`` demonstrations read the note
first and act on the tool result in a second call), where other tasks' scripts run whole.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import click

#: The vocabulary of answers: each one token (after a space) in the tiny model's tokenizer.
WORDS: Final[tuple[str, ...]] = ("city", "light", "rain", "page")
#: Names of the note files, one ``note`` instance each (single tokens too, none in :data:`WORDS`).
NOTE_NAMES: Final[tuple[str, ...]] = ("data", "list", "text", "input", "code", "path", "line", "value")
#: First line after the shebang of a ``solve.sh`` replayed one command per model call.
ONE_CALL_PER_LINE: Final = "# oracle: one model call per line"

Kind = Literal["touch", "mkdir", "note"]
KINDS: Final[tuple[Kind, ...]] = ("touch", "mkdir", "note")


@dataclass(frozen=True)
class Instance:
    """One task of the family.

    Attributes:
        kind: ``touch``, ``mkdir`` or ``note``.
        word: The answer: the name the new entry must have.
        note: ``note`` only: the file (``<note>.txt``) that holds the answer.
    """

    kind: Kind
    word: str
    note: str = ""

    @property
    def task_id(self) -> str:
        """``<kind>-<word>`` (``note-<note>`` for ``note``: the answer is not in the name)."""
        return f"note-{self.note}" if self.kind == "note" else f"{self.kind}-{self.word}"

    @property
    def instruction(self) -> str:
        """The prompt the harness gets."""
        if self.kind == "touch":
            return f"Create an empty file named {self.word}."
        if self.kind == "mkdir":
            return f"Create a directory named {self.word}."
        return f"The file {self.note}.txt holds a name. Create an empty file with that name."

    @property
    def commands(self) -> tuple[str, ...]:
        """The oracle's commands, one model call each."""
        if self.kind == "touch":
            return (f"touch {self.word}",)
        if self.kind == "mkdir":
            return (f"mkdir {self.word}",)
        return (f"cat {self.note}.txt", f"touch {self.word}")


def instances(words: tuple[str, ...] = WORDS, notes: tuple[str, ...] = NOTE_NAMES) -> list[Instance]:
    """Every instance: one ``touch`` and one ``mkdir`` per word, one ``note`` per note name (its
    answer the words in turn), in a fixed order."""
    out: list[Instance] = [Instance(k, w) for k in ("touch", "mkdir") for w in words]
    out += [Instance("note", words[i % len(words)], n) for i, n in enumerate(notes)]
    return out


def split(items: list[Instance], seed: int, test_per_kind: int = 1) -> dict[str, list[Instance]]:
    """Disjoint ``train``/``test`` sets: ``test_per_kind`` held-out instances of each kind.

    Held-out instances use pairwise different answers where possible, so every word stays in
    ``train`` for every kind but the held-out pair.

    Args:
        items: The instances (:func:`instances`).
        seed: Seed of the draw.
        test_per_kind: Held-out instances per kind (>= 1, fewer than the kind's instances).

    Raises:
        ValueError: ``test_per_kind`` leaves a kind without training instances.
    """
    rng = random.Random(f"words-split:{seed}")
    test: list[Instance] = []
    used: set[str] = set()
    for kind in KINDS:
        pool = [i for i in items if i.kind == kind]
        if not 1 <= test_per_kind < len(pool):
            raise ValueError(f"test_per_kind={test_per_kind}: kind {kind} has {len(pool)} instances")
        rng.shuffle(pool)
        pool.sort(key=lambda i: i.word in used)  # stable: unused answers first, in shuffled order
        for inst in pool[:test_per_kind]:
            test.append(inst)
            used.add(inst.word)
    return {"train": [i for i in items if i not in test], "test": [i for i in items if i in test]}


_TASK_TOML: Final = """\
version = "1.0"

[metadata]
author_name = "OpenForgeRL"
difficulty = "easy"
category = "words"
tags = ["openforge-words", "{split}"]

[agent]
timeout_sec = 60.0

[verifier]
timeout_sec = 30.0

[environment]
cpus = 1
memory_mb = 512
storage_mb = 64
allow_internet = false
"""

_TEST_SH: Final = """\
#!/usr/bin/env bash
# Verifier of a `words` task: gated partial credit, written by check.py to /logs/verifier/reward.json.
set -u
mkdir -p /logs/verifier
cd /app || { echo '{"reward": 0}' > /logs/verifier/reward.json; exit 0; }
python3 /tests/check.py
"""

_CHECK_PY: Final = '''\
"""Verifier of a `words` task (run by tests/test.sh in /app; writes /logs/verifier/reward.json).

0.5 for exactly one new entry of the asked type, 1.0 when it also has the asked name.
"""

import json
from pathlib import Path

EXPECTED = {expected}
new = sorted(p for p in Path(".").iterdir() if p.name not in EXPECTED["before"])
kind_ok = len(new) == 1 and (new[0].is_dir() if EXPECTED["type"] == "dir" else new[0].is_file())
name_ok = kind_ok and new[0].name == EXPECTED["name"]
reward = 1.0 if name_ok else 0.5 if kind_ok else 0.0
print(f"new entries: {{[p.name for p in new]}}; type ok: {{kind_ok}}; name ok: {{name_ok}}")
result = {{"reward": reward, "type_ok": int(kind_ok), "name_ok": int(name_ok)}}
Path("/logs/verifier/reward.json").write_text(json.dumps(result))
'''


def write_task(inst: Instance, folder: Path, split_name: str) -> None:
    """Writes one Harbor task folder for ``inst`` (replacing any folder already there)."""
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "solution").mkdir()
    (folder / "task.toml").write_text(_TASK_TOML.format(split=split_name))
    (folder / "instruction.md").write_text(inst.instruction + "\n")
    dockerfile = "FROM python:3.11-slim-bookworm\nWORKDIR /app\n"
    before: list[str] = []
    if inst.kind == "note":
        files = folder / "environment" / "files"
        files.mkdir()
        (files / f"{inst.note}.txt").write_text(inst.word + "\n")
        dockerfile += "COPY files/ /app/\n"
        before.append(f"{inst.note}.txt")
    (folder / "environment" / "Dockerfile").write_text(dockerfile)
    expected = {"name": inst.word, "type": "dir" if inst.kind == "mkdir" else "file", "before": before}
    (folder / "tests" / "test.sh").write_text(_TEST_SH)
    (folder / "tests" / "check.py").write_text(_CHECK_PY.format(expected=json.dumps(expected)))
    solve = "#!/usr/bin/env bash\n" + ONE_CALL_PER_LINE + "\nset -eu\ncd /app\n" + "\n".join(inst.commands) + "\n"
    (folder / "solution" / "solve.sh").write_text(solve)
    for script in (folder / "tests" / "test.sh", folder / "solution" / "solve.sh"):
        script.chmod(0o755)


def generate(out: Path, seed: int = 0, test_per_kind: int = 1) -> dict[str, list[str]]:
    """Writes the family under ``out/train`` and ``out/test`` (each folder replaced whole).

    Returns:
        Task ids per split, in the family's order.
    """
    sets = split(instances(), seed, test_per_kind)
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


@click.group()
def tasks() -> None:
    """Task sets."""


@tasks.command("words")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Task root to write (train/, test/).")
@click.option("--seed", default=0, show_default=True, help="Seed of the train/test split.")
@click.option("--test-per-kind", default=1, show_default=True, help="Held-out instances per kind.")
def words_command(out: Path, seed: int, test_per_kind: int) -> None:
    """Write the `words` task family (the CPU demo's tasks) as Harbor task folders under OUT."""
    ids = generate(out, seed, test_per_kind)
    for split_name, names in ids.items():
        click.echo(f"{split_name}: {len(names)} tasks: {' '.join(names)}")
