"""``openforge model``: build the tiny local model used by the tests and the CPU demo."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click


@click.group()
def model() -> None:
    """Models for machines without a model hub."""


@model.command("init-tiny")
@click.option(
    "--size",
    type=click.Choice(["1m", "10m", "50m"]),
    default="10m",
    show_default=True,
    help="Approximate parameter count.",
)
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, help="Directory to write.")
@click.option("--seed", default=0, show_default=True, help="Seed of the weights and the tokenizer corpus.")
def init_tiny(size: str, out_dir: Path, seed: int) -> None:
    """Build a random-init Qwen2-architecture model and a locally trained tokenizer in OUT.

    Nothing is downloaded. The directory loads with transformers' from_pretrained, with vLLM,
    and with the trainer; its chat template supports tools and <think> reasoning. Needs the
    inference stack (requirements/inference-cpu.txt).
    """
    cmd = [
        sys.executable,
        "-m",
        "openforge_inference.tiny_model",
        "--size",
        size,
        "--out",
        str(out_dir),
        "--seed",
        str(seed),
    ]
    result = subprocess.run(cmd, check=False)
    if result.returncode != 0:
        raise click.ClickException(f"building the tiny model failed (exit {result.returncode})")
    click.echo(f"tiny {size} model written to {out_dir}")
