"""Anthropic's Messages API at the edge: its requests as the chat jobs the router runs, and the
answers and errors back in its shapes (request, answer, events, errors)."""
