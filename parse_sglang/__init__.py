"""PARSE: parallel prefix verification for speculative generation, for SGLang."""

__version__ = "0.1.0"
