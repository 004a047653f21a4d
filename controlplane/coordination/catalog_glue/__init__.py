"""What coordination needs from the catalog (`sources`) and the adapter that gives it
(`catalog_bridge`), so that the protocols and orchestration never import the catalog."""
