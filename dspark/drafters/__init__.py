"""Drafters that need no training: plain decoding and prompt lookup. Learned ones live in drafter_service."""
