"""hpp.forkshare.run_shares: results in task order, errors and lost children, the merge, no child left behind."""

import multiprocessing
import os

import pytest

from hpp.forkshare import can_fork, run_shares

pytestmark = pytest.mark.skipif(not can_fork(), reason="needs the fork start method")


def _where(task):
    return task, os.getpid()


def test_results_come_back_in_task_order_from_this_process_and_the_children():
    me = os.getpid()
    out = run_shares(_where, [3, 1, 2])
    assert [t for t, _ in out] == [3, 1, 2]
    assert out[0][1] == me                                  # the first share runs here
    assert all(pid != me for _, pid in out[1:])             # the others in forked children
    assert len({pid for _, pid in out}) == 3
    assert multiprocessing.active_children() == []          # every child reaped


def test_merge_sees_every_result_and_its_value_is_returned():
    seen = []
    got = run_shares(lambda t: t * t, [1, 2, 3], merge=lambda rs: seen.append(list(rs)) or sum(rs))
    assert got == 14 and seen == [[1, 4, 9]]
    assert multiprocessing.active_children() == []


def test_an_error_in_a_child_is_raised_here():
    me = os.getpid()

    def run(task):
        if os.getpid() != me:
            raise ValueError(f"share {task} failed")
        return task

    with pytest.raises(ValueError, match="share 2 failed"):
        run_shares(run, [1, 2])
    assert multiprocessing.active_children() == []


def test_a_child_that_dies_without_an_answer_has_its_share_run_here():
    me = os.getpid()

    def run(task):
        if os.getpid() != me:
            os._exit(3)                                     # dies before sending anything
        return task * 10

    assert run_shares(run, [1, 2, 3]) == [10, 20, 30]
    assert multiprocessing.active_children() == []


def test_an_error_in_the_merge_is_raised_and_the_children_are_reaped():
    def merge(_results):
        raise RuntimeError("merge failed")

    with pytest.raises(RuntimeError, match="merge failed"):
        run_shares(lambda t: t, [1, 2], merge=merge)
    assert multiprocessing.active_children() == []
