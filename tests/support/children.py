"""A test run's children die with it.

Servers, gateways and launchers run in sessions of their own (so ``stop()`` takes their whole tree),
and a local Ray cluster's processes are the run's descendants too. Fixture teardown stops them when a run
ends; a run stopped by SIGTERM (a CI timeout) runs no teardown at all, and each of those trees used to
survive it with PPID 1 and starve the next run's memory. ``install()`` (tests/conftest.py) makes SIGTERM
and SIGINT first reap every descendant the run started (and every process group it registered, which
catches a tree whose middle already died), then end the run as the signal would have: SIGTERM kills
the process, SIGINT interrupts pytest (which then tears down as usual). ``spawn`` also gives each
child a parent-death signal, so even a SIGKILLed run takes its direct children along.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import subprocess
import threading
from typing import List, Set, Tuple

import psutil

GRACE_S = 3.0  # SIGTERM first (SGLang's launcher takes its tree down), then SIGKILL what is left

_groups: Set[int] = set()  # process groups (sessions) of children started here
_before: Set[Tuple[int, float]] = set()  # descendants that existed before install(): not ours to reap
_installed = False
_reaping = threading.Lock()


def _die_with_parent() -> None:
    # Runs in the child before exec. Linux sends the signal when the thread that forked the child ends,
    # so children must be started from a thread that outlives them (the suite starts them from fixtures).
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def spawn(cmd: List[str], **popen_kwargs) -> subprocess.Popen:
    """``subprocess.Popen`` in a session of its own, registered for reaping, killed if this process dies."""
    proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=_die_with_parent, **popen_kwargs)
    track(proc)
    return proc


def track(proc: subprocess.Popen) -> None:
    """Reap ``proc``'s process group too (it was started with ``start_new_session``)."""
    _groups.add(proc.pid)


def _key(p: psutil.Process) -> Tuple[int, float]:
    return p.pid, p.create_time()


def _descendants() -> List[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if _key(p) not in _before:
                out.append(p)
        except psutil.Error:
            pass
    return out


def _signal_all(procs: List[psutil.Process], sig: int) -> None:
    for pgid in list(_groups):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


def reap() -> None:
    """Stop every process this run started, whatever state the run is in."""
    if not _reaping.acquire(blocking=False):
        return  # a second signal while reaping: the first reap goes on
    try:
        procs = _descendants()
        _signal_all(procs, signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=GRACE_S)
        # What the SIGTERM did not end, and anything started meanwhile (a launcher's late child).
        procs = alive + _descendants()
        _signal_all(procs, signal.SIGKILL)
        psutil.wait_procs(procs, timeout=GRACE_S)
        _groups.clear()
    finally:
        _reaping.release()


def _on_signal(signum, frame) -> None:
    reap()
    if signum == signal.SIGINT:
        raise KeyboardInterrupt  # pytest reports the interrupted run and tears its fixtures down
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # end as SIGTERM ends a process: the caller sees the signal


def reclaim() -> None:
    """Take SIGTERM and SIGINT back after code that set its own handler (``ray.init`` sets one that
    raises SystemExit, which pytest would report as one failed test and then run on)."""
    if not _installed or threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(sig) is not _on_signal:
            signal.signal(sig, _on_signal)


def install() -> None:
    """Reap on SIGTERM, SIGINT and at exit (main thread only; once)."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    _installed = True
    for p in psutil.Process().children(recursive=True):  # e.g. pytest run in-process by a host program
        try:
            _before.add(_key(p))
        except psutil.Error:
            pass
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    atexit.register(reap)
