"""Drafter networks, their configuration and their checkpoints."""
