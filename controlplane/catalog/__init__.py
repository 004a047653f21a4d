"""The SQL catalog: models, migrations helpers, the read/write API, audit queries."""
