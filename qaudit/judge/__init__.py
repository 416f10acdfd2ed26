"""Stage 6, judge: rows and evidence become findings; reports, baselines, diffs."""
