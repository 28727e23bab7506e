"""The multi-host wing (see docs/architecture.md): the control channel's wire
(wire.py) and endpoints (control.py), the master's ledger of how the ranks
ended (verdict.py), the coordination that decides the verdict on every host
(coordination.py), SSH (ssh.py) and the rank wrapper (rank.py).

Nothing is imported here: every rank's wrapper imports this package."""
