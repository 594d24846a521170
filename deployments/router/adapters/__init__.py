"""The router's outside world: its ports (`ports.py`) and Serve's own behind them
(`serve_ports.py`, `handle_replicas.py`), the router run inside an ingress replica
(`in_process.py`), and the request router Serve runs in the handle's process to choose a
backend's replica (`replica_choice.py`).
"""
