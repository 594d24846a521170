"""The CPU fallback replica that ends every failover chain: Ollama or llama.cpp in-process."""
