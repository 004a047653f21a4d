"""What the agent API's servers and clients share: the mapping between Meridian errors
and gRPC status codes (status.py)."""
