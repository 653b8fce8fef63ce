"""`python framework/sebulba/ray/reaper.py PARENT_PID -- COMMAND...`: run COMMAND (a local Ray head, `ray start --head
--block`) in this process's session and, once PARENT_PID is gone, COMMAND ended or a SIGTERM/SIGINT arrived,
stop every process of the session: SIGTERM, a grace period, then SIGKILL (this process last).

Ray's own fate-sharing covers its direct children only: after a SIGKILL of the driver, the agents a raylet
starts (dashboard agent, runtime-env agent) were found still running minutes later. They all stay in the
session that this reaper leads (some in process groups of their own), so the reaper signals the session's
processes one by one, found by their session id in /proc.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE_SECONDS = 5.0  # `ray start --block` stops its processes on SIGTERM within a second or two here
POLL_SECONDS = 0.05


def session_processes(session_id: int) -> list[int]:
    """The live (not zombie) processes of a session, by /proc/PID/stat: its fields after the command's ')' are
    state, ppid, pgrp, session."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # the process ended while we looked
            continue
        if fields[0] != "Z" and int(fields[3]) == session_id:
            found.append(int(stat.parent.name))
    return found


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def wait_until_gone(session_id: int, seconds: float, spare: int = -1) -> list[int]:
    """Wait up to `seconds` for the session's processes (but `spare`) to end; those still alive."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [pid for pid in session_processes(session_id) if pid != spare]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(POLL_SECONDS)


def stop_session(session_id: int, grace_seconds: float, spare: int = -1) -> None:
    """SIGTERM to every process of the session (but `spare`), SIGKILL to those left after the grace period, and
    back once none is left."""
    signal_all([pid for pid in session_processes(session_id) if pid != spare], signal.SIGTERM)
    left = wait_until_gone(session_id, grace_seconds, spare)
    signal_all(left, signal.SIGKILL)
    wait_until_gone(session_id, grace_seconds, spare)


def main(argv: list[str]) -> None:
    parent, command = int(argv[0]), argv[argv.index("--") + 1:]
    stopping = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.append(True))
    child = subprocess.Popen(command)
    while not stopping and child.poll() is None and os.getppid() == parent:
        time.sleep(0.2)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stop_session(os.getsid(0), GRACE_SECONDS, spare=os.getpid())
    child.poll()  # reap it: its zombie would not count, but its exit status is ours to collect


if __name__ == "__main__":
    main(sys.argv[1:])
