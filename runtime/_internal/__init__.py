"""Internals of the runtime: not a public API."""
