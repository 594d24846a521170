"""The request path: a job's walk down its chain (`flow.py`), one attempt on a link (`serving.py`),
a link's shared state (`link.py`), what counts as a fault (`faults.py`), and a whole answer
generated as a stream (`whole_by_stream.py`).
"""
