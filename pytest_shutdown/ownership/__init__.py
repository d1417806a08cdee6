"""The ownership layer: whose is a resource? Creation sites (``origins``), the owner search
(``owners``), atexit records (``atexit_calls``), gc back-references (``backrefs``), the
containment of escaped processes (``containment``).

May import the base, findings and _os layers (``_base``, ``findings``, ``_os``); nothing above
it. Kept empty: the guard records creation sites on every session, the owner search is imported
only when something was left.
"""
