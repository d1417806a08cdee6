"""Operating-system primitives shared by the guard, the helpers and the reference engine.

Imports nothing of the package above it (only the standard library and, lazily, psutil).
"""
