"""Pipelines: a source's frames through one model or a chain, post-processed into results."""
