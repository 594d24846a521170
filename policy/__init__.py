"""Pure decisions: facts and a clock in, decisions out. No Ray, no Serve, no HTTP."""

__all__ = []
