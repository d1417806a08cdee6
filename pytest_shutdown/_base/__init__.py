"""The base layer: utilities of no concern to shutdown (the speed machinery is its neighbour,
``_fast``). Imports nothing of the package; kept empty: importing a module here loads only that
module.
"""
