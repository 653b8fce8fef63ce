"""`python -m framework.sebulba.ray.reaper PARENT_PID -- COMMAND...`: run COMMAND (a local Ray head, `ray start --head
--block`) in this process's session and, once PARENT_PID is gone, COMMAND ended or a SIGTERM/SIGINT arrived,
stop every process of the session: SIGTERM, a grace period, then SIGKILL (this process included).

Ray's own fate-sharing covers its direct children only: after a SIGKILL of the driver, the agents a raylet
starts (dashboard agent, runtime-env agent) were found still running minutes later. They all stay in the
session that this reaper leads, so one killpg reaches them.
"""
import os
import signal
import subprocess
import sys
import time

GRACE_SECONDS = 5.0  # `ray start --block` stops its processes on SIGTERM within a second or two here


def main(argv: list[str]) -> None:
    parent, command = int(argv[0]), argv[argv.index("--") + 1:]
    stopping = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.append(True))
    child = subprocess.Popen(command)
    while not stopping and child.poll() is None and os.getppid() == parent:
        time.sleep(0.2)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group's SIGTERM is for the others
    os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(0, signal.SIGKILL)  # whatever is left of the session, this reaper last


if __name__ == "__main__":
    main(sys.argv[1:])
