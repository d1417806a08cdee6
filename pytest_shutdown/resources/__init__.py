"""Resource kinds: what a test can leave behind, one module per kind."""
