"""The update's row order (`train.rl_update._micro_major`): a call's rows with loss tokens fill
its micro-batches one after another, so its padding rows make whole micro-batches, which the
update step does not run (tests/rl/test_update_accumulated.py shows they change nothing)."""

import numpy as np
import pytest

from avalon.train.rl_update import _micro_major


@pytest.mark.parametrize("loss_rows,per_call,micro,calls", [
    ([0, 1, 2], 8, 4, 1), ([0, 2, 5, 6, 9], 8, 2, 2), (list(range(7)), 12, 4, 1),
    ([0, 1, 2, 3, 4], 6, 4, 2)])  # the last: rows not a multiple of the micro-batches
def test_micro_major_order_makes_padding_whole_micro_batches(loss_rows, per_call, micro, calls):
    has_loss = np.zeros(per_call * calls, bool)
    has_loss[loss_rows] = True
    order = _micro_major(has_loss, per_call, micro)
    assert sorted(order) == list(range(len(has_loss)))  # a permutation
    if per_call % micro:
        assert list(order) == list(range(len(has_loss)))
        return
    m = per_call // micro
    for c in range(calls):
        call = has_loss[order[c * per_call:(c + 1) * per_call]]
        assert (order[c * per_call:(c + 1) * per_call] // per_call == c).all()  # rows stay
        with_loss = [bool(call[j::micro].any()) for j in range(micro)]
        # The call's loss rows fill the fewest micro-batches, the first ones.
        need = -(-int(call.sum()) // m)
        assert with_loss == [True] * need + [False] * (micro - need)
