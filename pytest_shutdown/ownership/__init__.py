"""The ownership layer: whose is a resource? May import ``_base``, ``findings`` and ``_os``.
Kept empty: the owner search is imported only when something was left.
"""
