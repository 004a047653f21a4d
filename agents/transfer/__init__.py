"""Transfers between node agents (spec/dataplane.md, *Transfers*): the Sync sender
and receiver with resume, Replicate, Fetch, per-link bandwidth caps with priority,
source choice by RTT, and a transfer record for every copy.

`TransferService` (service.py) answers the Signature, Sync, Replicate and Fetch
calls; `pull` (pull.py) receives one version from a source agent with Sync.
"""
