"""Routing inside a region (issue 16): any agent takes a request and sends it to the
owners of its key, one hop (`service.RoutedAgentService`), and a committed write is
copied to the other owners before it is acked (`copies.place_copies`)."""

from agents.routing.copies import place_copies
from agents.routing.peers import PeerStubs
from agents.routing.service import MembersSource, RoutedAgentService

__all__ = ["MembersSource", "PeerStubs", "RoutedAgentService", "place_copies"]
