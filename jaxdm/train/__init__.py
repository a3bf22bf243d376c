"""Training decision models: packed SFT with the mixed target, LoRA, HF export."""
