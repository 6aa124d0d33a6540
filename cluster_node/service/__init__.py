"""The clustered service: the user's state machine (api.py), its container, and examples."""
