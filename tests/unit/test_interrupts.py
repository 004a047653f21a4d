"""SIGTERM and SIGHUP taken as Ctrl-C within a command, except a signal inherited as
ignored (`nohup`): a logout must not stop it."""

from __future__ import annotations

import os
import signal

import pytest

from controlplane.cli.interrupts import Terminated, terminate_as_interrupt


def test_a_terminate_raises_as_an_interrupt_and_the_handler_is_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt) as info, terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between bytecodes of this thread
            pass
    assert isinstance(info.value, Terminated) and str(info.value) == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_hangup_ignored_by_nohup_stays_ignored() -> None:
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with terminate_as_interrupt():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)  # ignored: nothing is raised
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
