"""Stage 2, plan: pure decisions about the model to build: precision, widths, pipeline layout, tracking policies, sizes, which Megatron and TE (no torch)."""
