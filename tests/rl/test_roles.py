"""Per-role diagnostics (rl/roles.py): loss tokens and mean advantage per role from the packed
batch, and the gradient's per-role parts, which add up to the step's gradient."""

import jax
import numpy as np
import pytest

from avalon import model as M
from avalon.rl.build import build_rl_batch
from avalon.rl.roles import CEO, SPECIALISTS, role_grad_norms
from avalon.rl.update import make_update_step
from tests.rl.helpers import make_group, make_rollout, make_row
from tests.rl.test_update import CFG, RL, ROUTING, SEQ


def _groups():
    rng = np.random.default_rng(3)
    groups = []
    for g in range(2):
        rollouts = []
        for r in range(3):
            rows = [make_row(rng, int(rng.integers(8, SEQ)), agent=a, routing_shape=ROUTING)
                    for a in ("ceo", "a1", "a2")[:1 + (r + g) % 3]]
            rollouts.append(make_rollout(rows, [float(r * (g + 1))], budget=2,
                                         hires=len(rows) - 1))
        groups.append(make_group(g, rollouts))
    return groups


def test_role_metrics_count_each_roles_loss_tokens_and_advantage():
    groups = _groups()
    batch, stats = build_rl_batch(groups, RL, seq_len=SEQ, num_seqs_multiple=4,
                                  routing_shape=ROUTING)
    from avalon.rl.advantages import score_groups, token_advantages
    scored, _ = score_groups(groups, RL)
    want = {CEO: [], SPECIALISTS: []}
    for g in scored:
        for rollout, a in zip(g.rollouts, g.advantages):
            for row in rollout.rows:
                adv = token_advantages(row, float(a), RL)[1:][row.loss_mask[1:]]
                want[CEO if row.agent == "ceo" else SPECIALISTS] += adv.tolist()
    m = stats.as_metrics()
    for role, name in ((CEO, "ceo"), (SPECIALISTS, "specialists")):
        assert m[f"role/{name}/loss_tokens"] == len(want[role]) > 0
        assert m[f"role/{name}/adv_mean"] == pytest.approx(np.mean(want[role]), rel=1e-5)
    assert (stats.roles > 0).sum() == batch.loss_mask.sum()
    assert ((stats.roles > 0) == batch.loss_mask).all()


def test_role_gradient_parts_add_up_to_the_step():
    params = M.init_params(jax.random.key(0), CFG)
    step = make_update_step(CFG, RL)
    batch, stats = build_rl_batch(_groups(), RL, seq_len=SEQ, num_seqs_multiple=4,
                                  routing_shape=ROUTING)
    everything = np.asarray(batch.loss_mask)
    full = float(step.masked_grad_norm(params, batch, everything))
    _, metrics = step(step.init_state(params), batch)
    assert full == pytest.approx(float(metrics["grad_norm"]), rel=1e-5)
    out = role_grad_norms(step.masked_grad_norm, params, batch, stats.roles)
    ceo, spec = out["role/ceo/grad_norm"], out["role/specialists/grad_norm"]
    assert ceo > 0 and spec > 0 and full <= ceo + spec * (1 + 1e-5)
    assert out["role/ceo/grad_share"] == pytest.approx(ceo / (ceo + spec))
    # The CEO part under the whole batch's divisor is the CEO-only loss's gradient scaled by
    # n_ceo / n_total (a batch whose loss positions are the CEO's alone).
    ceo_only = batch.replace(loss_mask=np.asarray(batch.loss_mask) & (stats.roles == CEO))
    _, alone = step(step.init_state(params), ceo_only)
    n_ceo, n_all = int((stats.roles == CEO).sum()), int(batch.loss_mask.sum())
    assert ceo == pytest.approx(float(alone["grad_norm"]) * n_ceo / n_all, rel=1e-4)
