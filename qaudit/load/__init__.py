"""Stage 1, load: input files become a ModelConfig and a QuantRecipe (no torch)."""
