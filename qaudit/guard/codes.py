"""`qaudit guard`'s own exit codes (docs/guard.md); every other code is the job's."""

EXIT_STOPPED = 10  # the guard stopped the job before an optimizer step that lost gradients
EXIT_GUARD_FAILED = 3  # the guard itself failed, or vouched for nothing
