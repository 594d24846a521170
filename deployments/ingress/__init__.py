"""The front door: the OpenAI-compatible Ingress deployment (`app.py`) and what it is made of:
auth and priority (`auth.py`), body limits (`body.py`), request -> job (`jobs.py`), error JSON
(`error_response.py`), the overhead header, its metrics, the Files and Batch routes
(`files_routes.py`), and the Serve options of the replicas in front of the engines
(`front_options.py`)."""
