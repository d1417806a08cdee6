"""The base layer: utilities of no concern to shutdown (the speed machinery is its neighbour,
``_fast``): the helpers' hidden contextmanager and their argument checks. Imports nothing of the
rest of the package; kept empty: importing a module here loads only that module and what it
imports from here.
"""
