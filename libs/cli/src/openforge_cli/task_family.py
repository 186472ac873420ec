"""``openforge tasks``: the ``lines`` task family, small enough for a tiny model to learn on a CPU, and
the ``miniwob`` browser family (:mod:`openforge_browser.miniwob`).

Every instance is a Harbor task folder (``task.toml``, ``instruction.md``, ``environment/``,
``tests/``, ``solution/solve.sh``): a workspace with a ``data.txt`` of a few lines (words drawn
from :data:`WORDS`) and an instruction to write something about it to ``answer.txt``. Five kinds:

=========  =====================================================  ==================================
kind       instruction                                            oracle (one model call a line)
=========  =====================================================  ==================================
``count``  Write the number of lines in data.txt to answer.txt.   ``wc -l < data.txt > answer.txt``
``sort``   Write the lines of data.txt, sorted, to answer.txt.    ``sort data.txt > answer.txt``
``first``  Write the first line of data.txt to answer.txt.        ``head -n 1 data.txt > answer.txt``
``last``   Write the last line of data.txt to answer.txt.         ``tail -n 1 data.txt > answer.txt``
``check``  Ticket N: run check.sh and write the word it prints    ``bash check.sh``, then
           to answer.txt.                                         ``echo passed > answer.txt`` (or
                                                                  ``failed``: read from the result)
=========  =====================================================  ==================================

The answer differs from instance to instance (another ``data.txt``, another verdict), the skill
does not: the same instruction asks for the same command. ``check`` is the multi-turn variant:
its answer is only known from the first call's tool result; its ticket number makes each
instruction unique (the ``scripted-oracle`` engine finds a task by its instruction).

The verifier (``tests/check.py``) gives gated partial credit, written to ``reward.json``: 0.2
when ``answer.txt`` exists (the right target), 1.0 when its content is right (compared line by
line, surrounding blanks ignored). A policy that writes ``answer.txt`` with a command picked at
random among the five earns about ``0.2 + 0.8 / 5``, so GRPO groups have reward variance from the
first steps.

Instances are split reproducibly into disjoint ``train`` and ``test`` sets (:func:`split`),
``test_per_kind`` of each kind held out: the test measures the skill on workspaces (and
verdicts) never trained on, not a memorised answer.

The second line of ``solution/solve.sh`` is :data:`ONE_CALL_PER_LINE`: the ``scripted-oracle`` engine then
replays each command line as its own model call, where other tasks' scripts run whole.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import click

#: Words of the ``data.txt`` lines (single tokens after a space in the tiny model's tokenizer).
WORDS: Final[tuple[str, ...]] = (
    "city", "light", "rain", "page", "map", "tab", "root", "hand", "plan", "square", "branch", "server",
)  # fmt: skip
#: The verdicts ``check.sh`` prints.
VERDICTS: Final[tuple[str, ...]] = ("passed", "failed")
#: First line after the shebang of a ``solve.sh`` replayed one command per model call (the
#: ``scripted-oracle`` engine's ``ONE_CALL_PER_LINE``; a test checks both agree).
ONE_CALL_PER_LINE: Final = "# oracle: one model call per line"

Kind = Literal["count", "sort", "first", "last", "check"]
KINDS: Final[tuple[Kind, ...]] = ("count", "sort", "first", "last", "check")
_INSTRUCTIONS: Final[dict[str, str]] = {
    "count": "Write the number of lines in data.txt to answer.txt.",
    "sort": "Write the lines of data.txt, sorted, to answer.txt.",
    "first": "Write the first line of data.txt to answer.txt.",
    "last": "Write the last line of data.txt to answer.txt.",
    "check": "Ticket {ticket}: run check.sh and write the word it prints to answer.txt.",
}
_COMMANDS: Final[dict[str, tuple[str, ...]]] = {
    "count": ("wc -l < data.txt > answer.txt",),
    "sort": ("sort data.txt > answer.txt",),
    "first": ("head -n 1 data.txt > answer.txt",),
    "last": ("tail -n 1 data.txt > answer.txt",),
    "check": ("bash check.sh", "echo {verdict} > answer.txt"),
}


@dataclass(frozen=True)
class Instance:
    """One task of the family.

    Attributes:
        kind: One of :data:`KINDS`.
        index: The instance's number within its kind (0-based).
        lines: The lines of its ``data.txt``.
        ticket: ``check`` only: the ticket number in its instruction.
        verdict: ``check`` only: the word its ``check.sh`` prints.
    """

    kind: Kind
    index: int
    lines: tuple[str, ...]
    ticket: int = 0
    verdict: str = ""

    @property
    def task_id(self) -> str:
        """``<kind>-<index>``."""
        return f"{self.kind}-{self.index}"

    @property
    def instruction(self) -> str:
        """The prompt the harness gets."""
        return _INSTRUCTIONS[self.kind].format(ticket=self.ticket)

    @property
    def commands(self) -> tuple[str, ...]:
        """The oracle's commands, one model call each."""
        return tuple(c.format(verdict=self.verdict) for c in _COMMANDS[self.kind])

    @property
    def answer(self) -> tuple[str, ...]:
        """The lines ``answer.txt`` must hold."""
        if self.kind == "count":
            return (str(len(self.lines)),)
        if self.kind == "sort":
            return tuple(sorted(self.lines))
        if self.kind == "first":
            return self.lines[:1]
        if self.kind == "last":
            return self.lines[-1:]
        return (self.verdict,)


def instances(per_kind: int = 8, seed: int = 0) -> list[Instance]:
    """``per_kind`` instances of each kind, drawn reproducibly from ``seed``: ``data.txt`` of 2
    to 6 distinct words, its first and last lines different and not already sorted; ``check``
    verdicts alternating, ticket numbers distinct."""
    rng = random.Random(f"lines-family:{seed}")
    tickets = rng.sample(range(100, 1000), per_kind)
    out: list[Instance] = []
    for kind in KINDS:
        for i in range(per_kind):
            while True:
                lines = tuple(rng.sample(WORDS, rng.randint(2, 6)))
                if list(lines) != sorted(lines):
                    break
            if kind == "check":
                out.append(Instance(kind, i, lines, ticket=tickets[i], verdict=VERDICTS[i % 2]))
            else:
                out.append(Instance(kind, i, lines))
    return out


def split(items: list[Instance], seed: int, test_per_kind: int = 2) -> dict[str, list[Instance]]:
    """Disjoint ``train``/``test`` sets: ``test_per_kind`` held-out instances of each kind.

    Raises:
        ValueError: ``test_per_kind`` leaves a kind without training instances.
    """
    rng = random.Random(f"lines-split:{seed}")
    test: list[Instance] = []
    for kind in KINDS:
        pool = [i for i in items if i.kind == kind]
        if not 1 <= test_per_kind < len(pool):
            raise ValueError(f"test_per_kind={test_per_kind}: kind {kind} has {len(pool)} instances")
        test += rng.sample(pool, test_per_kind)
    return {"train": [i for i in items if i not in test], "test": [i for i in items if i in test]}


_TASK_TOML: Final = """\
version = "1.0"

[metadata]
author_name = "OpenForgeRL"
difficulty = "easy"
category = "lines"
tags = ["openforge-lines", "{split}"]

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
# Verifier of a `lines` task: gated partial credit, written by check.py to /logs/verifier/reward.json.
set -u
mkdir -p /logs/verifier
cd /app || { echo '{"reward": 0}' > /logs/verifier/reward.json; exit 0; }
python3 /tests/check.py
"""

_CHECK_PY: Final = '''\
"""Verifier of a `lines` task (run by tests/test.sh in /app; writes /logs/verifier/reward.json).

0.2 when answer.txt exists, 1.0 when its lines are the expected ones (blanks around them ignored).
"""

import json
from pathlib import Path

EXPECTED = {expected}
path = Path("answer.txt")
exists = path.is_file()
lines = [x.strip() for x in path.read_text(errors="replace").strip().splitlines()] if exists else []
right = exists and lines == EXPECTED
reward = 1.0 if right else 0.2 if exists else 0.0
print(f"answer.txt exists: {{exists}}; lines: {{lines[:8]}}; expected: {{EXPECTED}}")
Path("/logs/verifier/reward.json").write_text(json.dumps({{"reward": reward, "exists": int(exists)}}))
'''

_CHECK_SH: Final = """\
#!/usr/bin/env bash
# The ticket's check: prints its verdict.
echo {verdict}
"""


def write_task(inst: Instance, folder: Path, split_name: str) -> None:
    """Writes one Harbor task folder for ``inst`` (replacing any folder already there)."""
    if folder.exists():
        shutil.rmtree(folder)
    files = folder / "environment" / "files"
    files.mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "solution").mkdir()
    (folder / "task.toml").write_text(_TASK_TOML.format(split=split_name))
    (folder / "instruction.md").write_text(inst.instruction + "\n")
    (files / "data.txt").write_text("".join(line + "\n" for line in inst.lines))
    if inst.kind == "check":
        (files / "check.sh").write_text(_CHECK_SH.format(verdict=inst.verdict))
    (folder / "environment" / "Dockerfile").write_text(
        "FROM python:3.11-slim-bookworm\nWORKDIR /app\nCOPY files/ /app/\n"
    )
    (folder / "tests" / "test.sh").write_text(_TEST_SH)
    (folder / "tests" / "check.py").write_text(_CHECK_PY.format(expected=json.dumps(list(inst.answer))))
    solve = "#!/usr/bin/env bash\n" + ONE_CALL_PER_LINE + "\nset -eu\ncd /app\n" + "\n".join(inst.commands) + "\n"
    (folder / "solution" / "solve.sh").write_text(solve)
    for script in (folder / "tests" / "test.sh", folder / "solution" / "solve.sh"):
        script.chmod(0o755)


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


@click.group()
def tasks() -> None:
    """Task sets."""


@tasks.command("lines")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Task root to write (train/, test/).")
@click.option("--seed", default=0, show_default=True, help="Seed of the instances (data, tickets) and the split.")
@click.option("--test-per-kind", default=2, show_default=True, help="Held-out instances per kind.")
def lines_command(out: Path, seed: int, test_per_kind: int) -> None:
    """Write the `lines` task family (the CPU demo's tasks) as Harbor task folders under OUT."""
    ids = generate(out, seed, test_per_kind)
    for split_name, names in ids.items():
        click.echo(f"{split_name}: {len(names)} tasks: {' '.join(names)}")


@tasks.command("miniwob")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Task root to write (train/, test/).")
@click.option("--seed", default=0, show_default=True, help="Seed of the instances (labels, targets) and the split.")
@click.option("--test-per-kind", default=2, show_default=True, help="Held-out instances per kind.")
def miniwob_command(out: Path, seed: int, test_per_kind: int) -> None:
    """Write the `miniwob` browser task family (pages for the `browser` harness) as Harbor task folders under OUT."""
    from openforge_browser import miniwob

    ids = miniwob.generate(out, seed, test_per_kind)
    for split_name, names in ids.items():
        click.echo(f"{split_name}: {len(names)} tasks: {' '.join(names)}")
