"""Context safety: count exactly, clamp, compress, slide the window, and say what was done."""

__all__ = []
