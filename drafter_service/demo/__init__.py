"""The demo stack `make models` builds from the standard library's own text (no download)."""
