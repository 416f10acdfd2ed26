"""The Megatron the user runs: where it is (detect), without importing it."""
