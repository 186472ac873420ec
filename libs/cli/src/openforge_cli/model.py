"""``openforge model``: build the tiny local model used by the tests and the CPU demo."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

#: The families ``openforge_inference.tiny_model`` builds (a library cannot import a service, so
#: they are named here; a test checks the two lists agree).
TINY_FAMILIES = ("qwen", "llama3", "glm45", "mistral", "deepseek_v31")
#: The tiny model sizes (the inference service's ``tiny_model.SIZES``).
TINY_SIZES = ("1m", "10m", "50m", "300m")


@click.group()
def model() -> None:
    """Models for machines without a model hub."""


@model.command("init-tiny")
@click.option(
    "--size",
    type=click.Choice(TINY_SIZES),
    default="10m",
    show_default=True,
    help="Approximate parameter count.",
)
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True, help="Directory to write.")
@click.option("--seed", default=0, show_default=True, help="Seed of the weights and the tokenizer corpus.")
@click.option(
    "--family",
    type=click.Choice(TINY_FAMILIES),
    default="qwen",
    show_default=True,
    help="qwen: Qwen2 architecture, Qwen/Hermes chat template; llama3: Llama architecture, "
    "Llama 3's special tokens, Llama 3.1-style chat template; glm45: Glm4Moe (mixture-of-experts) "
    "architecture, GLM-4.5's special tokens, GLM-4.5-style chat template; mistral: Mistral "
    "architecture, Mistral's control tokens, Mistral v11-style chat template; deepseek_v31: DeepseekV3 "
    "(latent attention, mixture-of-experts) architecture, DeepSeek-V3.1's special tokens, "
    "DeepSeek-V3.1-style chat template.",
)
def init_tiny(size: str, out_dir: Path, seed: int, family: str) -> None:
    """Build a random-init model and a locally trained tokenizer in OUT.

    Nothing is downloaded. The directory loads with transformers' from_pretrained, with vLLM,
    and with the trainer. The default family (qwen) is a Qwen2-architecture model whose chat
    template supports tools and <think> reasoning; llama3 is a LlamaForCausalLM with Llama 3's
    special tokens (<|begin_of_text|>, <|start_header_id|>, <|eot_id|>, <|eom_id|>,
    <|python_tag|>...) and a Llama 3.1-style template with JSON tool calls; glm45 is a
    Glm4MoeForCausalLM with GLM-4.5's special tokens (<|user|>, <|assistant|>, <|observation|>,
    <arg_key>, <arg_value>...) and a GLM-4.5-style template; mistral is a MistralForCausalLM
    with Mistral's control tokens ([INST], [TOOL_CALLS], [ARGS]...) and a Mistral v11-style
    template; deepseek_v31 is a DeepseekV3ForCausalLM with DeepSeek-V3.1's special tokens
    (<｜User｜>, <｜Assistant｜>, <｜tool▁calls▁begin｜>, <｜tool▁sep｜>...) and a DeepSeek-V3.1-style
    template. Needs the inference stack
    (requirements/inference-cpu.txt).
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
        "--family",
        family,
    ]
    result = subprocess.run(cmd, check=False)
    if result.returncode != 0:
        raise click.ClickException(f"building the tiny model failed (exit {result.returncode})")
    click.echo(f"tiny {size} {family} model written to {out_dir}")
