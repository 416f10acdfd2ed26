"""Model families beyond the GPT base (hybrid Mamba, T5): each owns its fields, flags, layers and sizes."""
