"""Adapters that present an aiotier engine through another system's interface.

Each submodule imports nothing from the system it adapts: it defines small stand-ins for that
system's types (same names, same fields) and lets callers hand in the real ones, so aiotier
installs and tests without the other system being present.

- :mod:`aiotier.integrations.vllm`: vLLM's ``OffloadingManager`` over a ``BlockingEngine``, and the
  offloading spec vLLM loads by name.
"""
