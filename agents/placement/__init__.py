"""Placement inside a region (issue 16): which `r` agents of a region hold an object.

`hrw.owners` is the pure function (weighted rendezvous hashing, the straw2 draw);
`members.Members` is one immutable snapshot of a region's live agents and its `r`;
`watch.MembershipWatch` keeps the current snapshot from the registrations in etcd.
"""

from agents.placement.hrw import owners, placement_key
from agents.placement.members import Member, Members, copies_for
from agents.placement.watch import MembershipWatch

__all__ = ["Member", "Members", "MembershipWatch", "copies_for", "owners", "placement_key"]
