"""What the interpreter held when the package was first imported.

:mod:`pytest_shutdown` imports this module first, so the reading is the package's import time;
a module of its own (issue 47) so that :mod:`pytest_shutdown.ownership` reads it without
importing the public face above it.
"""

from __future__ import annotations

import gc

#: ``gc.get_freeze_count()`` when the package was first imported (the plugin loads it before
#: any conftest): what the interpreter froze by itself, not 0 everywhere (a bare CPython 3.12.1
#: starts with 375 of its built-in types' tuples frozen, immortal and owning nothing).
FROZEN_AT_IMPORT = gc.get_freeze_count()
