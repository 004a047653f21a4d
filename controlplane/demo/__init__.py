"""`meridian demo`: the whole product on one machine (spec/cli.md, issue 15).

`world` starts three regions of real processes on the local stack, with a Toxiproxy
proxy on every link between their agents; `training` makes real checkpoints; `steps`
runs the story and checks each step through the same CLI a user has.
"""
