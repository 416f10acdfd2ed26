"""Stage 4, build: the model with Megatron's module names, over one runtime's modules."""
