"""Files named on the command line: what a path is, and writing outputs without destroying anything (used by every stage)."""
