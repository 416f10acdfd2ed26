"""Encoder-decoder (T5) models."""
