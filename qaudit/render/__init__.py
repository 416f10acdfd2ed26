"""Renderers: the same Report as text; they never decide anything."""
