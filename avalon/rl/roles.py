"""Per-role diagnostics: is a shared policy being captured by one role?

Every agent is the same weights, so one role can dominate the update: the CEO's few long rows,
or the many specialists'. Three numbers per role, CEO vs specialists (every other agent):
- `loss_tokens`: the loss positions of the role's rows in the packed batch;
- `adv_mean`: the mean advantage over them (shaping included);
- `grad_norm`: the norm of the role's part of the gradient. The loss is a sum over tokens
  divided by the batch's loss-token count, so the gradient is exactly g_ceo + g_specialists,
  each the gradient of the role's tokens' terms under the same divisor; `grad_share` =
  |g_ceo| / (|g_ceo| + |g_specialists|) (0.5: balanced; near 1: the CEO drives the update).
The first two are host-side (`role_metrics`, every step); the norms cost one extra backward pass
per role (`role_grad_norms`, every `RLConfig.role_grad_every` steps).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from avalon.rl.batch import TrainBatch
from avalon.rl.types import TrajectoryRow

CEO, SPECIALISTS = 1, 2  # PackRow.role values (0: padding / no loss)
NAMES = {CEO: "ceo", SPECIALISTS: "specialists"}


def row_role(row: TrajectoryRow) -> int:
    return CEO if row.agent == "ceo" else SPECIALISTS


def role_metrics(batch: TrainBatch, roles: np.ndarray) -> dict[str, float]:
    """role/<name>/loss_tokens and role/<name>/adv_mean from a host batch and its role map."""
    out = {}
    mask = np.asarray(batch.loss_mask, bool)
    adv = np.asarray(batch.advantages, np.float64)
    for role, name in NAMES.items():
        here = mask & (roles == role)
        n = int(here.sum())
        out[f"role/{name}/loss_tokens"] = float(n)
        out[f"role/{name}/adv_mean"] = float(adv[here].mean()) if n else 0.0
    return out


def role_grad_norms(grad_norm: Callable, params, batch: TrainBatch, roles: np.ndarray,
                    put: Callable = lambda x: x) -> dict[str, float]:
    """role/<name>/grad_norm and role/ceo/grad_share. `grad_norm(params, batch, keep)` is
    `UpdateStep.masked_grad_norm`; `put` moves a host array like the batch (multi-host)."""
    norms = {name: float(grad_norm(params, batch, put(np.asarray(roles == role))))
             for role, name in NAMES.items()}
    out = {f"role/{name}/grad_norm": v for name, v in norms.items()}
    total = norms["ceo"] + norms["specialists"]
    out["role/ceo/grad_share"] = norms["ceo"] / total if total > 0 else 0.0
    return out
