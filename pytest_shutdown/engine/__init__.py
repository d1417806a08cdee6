"""The bundled reference engine, modelled on vLLM V1. Importing its modules imports torch."""
