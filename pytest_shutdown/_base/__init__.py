"""The base layer: utilities of no concern to shutdown (lazy dataclasses, lazy re-exports, the
``hidden`` contextmanager).

Imports nothing of the package (the standard library only). Kept empty: importing a module
here loads only that module.
"""
