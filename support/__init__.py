"""Test and benchmark support, kept out of the installed package (which is the server
plug-in and its quick-start demo): tiny models built at test time (`tiny_models`), the
synthetic trained pair that makes the judge measurable (`synthetic`), and what measures a
round from outside it (`host_traffic`, `sync_counter`, `round_probe/`).

Tests import it from the checkout's root (pytest's `pythonpath`); benchmarks put the root
on `sys.path` themselves.
"""
