"""Per-key limits: the shared ledger actor every ingress replica admits through (`ledger.py`)
and the ingress's side of it (`metering.py`)."""
