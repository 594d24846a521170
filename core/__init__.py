"""The innermost layer: vocabulary, config, topology, wire types and errors. No Ray, no Serve."""

__all__ = []
