"""What runs with the engines: our LLMServer (`llm_server.py`), the parent-death hook that takes
engine processes down with their replica (`parent_death.py`, imported at every interpreter
start of an engine process: keep this package light), the window vLLM's engine processes spin
in for their next step (`shm_spin.py`, from the same hook) and quiet health polls. The choice
of a backend's replica by session and prefix runs where the handle is, in the router
(deployments/router/adapters/replica_choice.py)."""
