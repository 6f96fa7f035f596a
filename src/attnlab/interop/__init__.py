"""Converters between attnlab models and other frameworks' (optional extra `[interop]`)."""
