"""Which Megatron a verdict is for: the releases qaudit knows, what an installed Megatron's own
code does (read, never imported), and the choice between them (`--megatron`)."""
