"""Which Megatron and TE a verdict is for: the releases and commits qaudit knows
(`releases.py`, `commits.py`), what an installed Megatron's own code does (`detect.py`, read,
never imported; `editable.py` for editable installs, `git_head.py` for a checkout's commit),
TE's version (`te.py`, `dist_info.py`), every file read bounded (`bounded.py`), and the choice
between them (`target.py`, `--megatron`)."""
