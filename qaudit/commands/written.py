"""The files a `check` or `diff` run writes, named for the clash check (an output must not
overwrite an input or another output)."""

from __future__ import annotations


def written_files(outputs: list[tuple[str, str]], write_baseline: str | None = None
                  ) -> list[tuple[str, str]]:
    """Every file a run writes, as (what, path): --output files, --write-baseline, and the
    GitHub job summary under GitHub Actions."""
    import os

    written = [(f"--output {fmt}", path) for fmt, path in outputs]
    if write_baseline:
        written.append(("--write-baseline", write_baseline))
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary and os.environ.get("GITHUB_ACTIONS") == "true":
        written.append(("GITHUB_STEP_SUMMARY", summary))
    return written
