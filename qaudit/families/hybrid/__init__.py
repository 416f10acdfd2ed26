"""Hybrid (Mamba) models."""
