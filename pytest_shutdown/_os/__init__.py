"""The _os layer: operating-system primitives shared by the guard, the helpers and the reference
engine (``/proc`` readings, the tree killer, prctl, forks, held-open files, one moment's
readings, the package's own threads, asynchronous exceptions).

May import the base and findings layers (``_base``, ``findings``), the standard library and,
lazily, psutil; nothing above it. Kept empty: importing one primitive loads only that one.
"""
