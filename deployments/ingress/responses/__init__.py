"""OpenAI's Responses API at the edge: its requests as the chat jobs the router runs, and the
answers back as response objects and their stream's events (request, answer, events, http)."""
