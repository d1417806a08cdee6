"""The base layer: utilities of no concern to shutdown. Imports nothing of the package; kept
empty: importing a module here loads only that module.
"""
