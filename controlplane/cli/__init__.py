"""The `meridian` command line: one module per command group, one error edge in main."""
