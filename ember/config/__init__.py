"""Plain configuration dataclasses and value types that every floor of ember may import.

The bottom floor of the import order: modules here import nothing from ember above them
(only the standard library and other modules of this package), so a layer, the KV cache,
a model family and the engine can share a type without importing one another.
"""
