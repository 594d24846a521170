"""The loops that keep a router replica's view fresh: Serve's status and health probes
(`watch.py`), the load it posts for autoscaling (`load_sync.py`), the placement actor's view
(`placement_sync.py`), the cluster manager's pools (`pool_sync.py`) and the slot broker's
leases (`slot_sync.py`).
"""
