"""Patches of SGLang internals, one file per patched concern."""
