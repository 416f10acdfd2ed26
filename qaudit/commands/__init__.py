"""The wiring layer the command line calls: each command runs the stages in order."""
