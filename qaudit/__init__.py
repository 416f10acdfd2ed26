"""qaudit: audit Megatron-LM / Transformer Engine quantization and gradient accumulation."""

__version__ = "0.1.0"

import warnings

# torch warns at import when NumPy is absent; qaudit never hands tensors to NumPy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
