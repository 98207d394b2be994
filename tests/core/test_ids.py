"""New ids: unique across threads and across a fork, and valid ids themselves."""

from __future__ import annotations

import os
import threading

import pytest

from statekeeper.ids import new_id, validate_id


def test_ids_from_many_threads_are_unique() -> None:
    found: list[list[str]] = []

    def make() -> None:
        found.append([new_id("msg") for _ in range(3_000)])

    threads = [threading.Thread(target=make) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [i for ids in found for i in ids]
    assert len(set(every)) == len(every) == 24_000
    assert all(validate_id(i) == i for i in every[:100])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    new_id()  # the parent holds buffered random bytes from here on
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: write its ids and leave at once
        os.close(read)
        os.write(write, " ".join(new_id() for _ in range(200)).encode())
        os._exit(0)
    os.close(write)
    parent = [new_id() for _ in range(200)]
    with os.fdopen(read) as pipe:
        child = pipe.read().split()
    os.waitpid(pid, 0)
    assert len(child) == 200
    # Same milliseconds and counters are likely; the random part must differ.
    assert not {i[-12:] for i in child} & {i[-12:] for i in parent}
