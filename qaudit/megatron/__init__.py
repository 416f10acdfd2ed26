"""Megatron-LM's side of the contract: wrappers, tracking policies and the GPT model layout."""
