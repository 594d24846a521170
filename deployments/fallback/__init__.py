"""The CPU fallback replica that ends every chain: Ollama or llama.cpp, in a child process."""
