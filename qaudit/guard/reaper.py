"""The job's reaper: started by `qaudit guard` beside the job, in a session of its own, run
as `python -I -S reaper.py GROUP` (nothing of the job's path or site is imported). It waits
on a pipe only qaudit holds open: a byte means qaudit saw the job end and nothing is to be
done; end-of-file without one means qaudit died while the job ran (SIGKILL, the OOM killer),
so the job's whole process group gets SIGTERM, as qaudit would have passed it. The kernel's
PR_SET_PDEATHSIG reaches only the job's first process; a shell wrapper that does not
forward SIGTERM would leave torchrun and its workers running (qaudit/guard/job.py)."""

import os
import signal
import sys


def main() -> None:
    group = int(sys.argv[1])
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)  # only qaudit's end decides
    while True:
        try:
            told = os.read(0, 1)
            break
        except InterruptedError:
            continue
    if not told:
        try:
            os.killpg(group, signal.SIGTERM)
        except OSError:
            pass


if __name__ == "__main__":
    main()
