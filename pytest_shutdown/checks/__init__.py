"""The assertion helpers: plain Python, no pytest needed. Each module checks one contract."""
