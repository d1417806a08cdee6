"""The _os layer: operating-system primitives. May import ``_base``, ``_fast``, ``findings``,
the standard library and, lazily, psutil. Kept empty: importing one primitive loads only that
one.
"""
