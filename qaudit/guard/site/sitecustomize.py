"""Put first on PYTHONPATH by `qaudit guard`: starts the guard in every Python process the
launch command runs (torchrun's workers included), then runs the sitecustomize this one
shadows, if there is one. Never stops the process: a failure is said on stderr and left for
the launcher to report (docs/guard.md)."""

import os
import sys


def _start():
    try:
        from qaudit.guard.child import start_from_environment

        start_from_environment()
    except Exception as exc:  # the job must not die of the guard's own start
        results = os.environ.get("QAUDIT_GUARD_RESULTS", "")
        message = f"the guard could not start in {sys.executable}: {type(exc).__name__}: {exc}"
        sys.stderr.write(f"qaudit guard: {message}\n")
        if results:
            path = os.path.join(results, f"start-failed-{os.getpid()}.txt")
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
            try:
                with os.fdopen(os.open(path, flags, 0o600), "w") as handle:
                    handle.write(message[:2000])
            except OSError:
                pass


def _run_the_shadowed_one():
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        candidate = os.path.join(entry or os.getcwd(), "sitecustomize.py")
        if os.path.abspath(os.path.dirname(candidate)) == here or not os.path.isfile(candidate):
            continue
        namespace = {"__name__": "sitecustomize", "__file__": candidate}
        with open(candidate, "rb") as source:
            exec(compile(source.read(), candidate, "exec"), namespace)
        return


if os.environ.get("QAUDIT_GUARD"):
    _start()
_run_the_shadowed_one()
