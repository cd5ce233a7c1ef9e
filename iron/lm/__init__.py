"""The Llama application: checkpoints, GGUF import, decoder graphs and generation."""
