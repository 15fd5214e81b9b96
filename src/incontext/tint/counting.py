"""Table 3 of the paper: parameters of TinT from its formula (biases ignored).

Q_split = D_sim^2 / H_sim + H_sim D_sim, Q = 4 Q_split + 3 T_sim D_sim / H_sim, D_sim = 4 D_aux,
T_sim = T_aux + K, K = D_aux / 4. Transformer: forward 7QL + L Q_split, backward (7Q + 6 D_sim H_sim) L,
descent 7QL, total (21Q + 6 D_sim H_sim) L (the printed total leaves out the forward's L Q_split).
"""

from __future__ import annotations

from dataclasses import dataclass

# the OPT models of Table 3: (D_aux, layers, H_sim) and the paper's printed numbers (billions)
OPT_MODELS = {
    "OPT-125M": (768, 12, 12),
    "OPT-350M": (1024, 24, 16),
    "OPT-1.3B": (2048, 24, 16),
    "OPT-2.7B": (2560, 32, 16),
}
PAPER_TABLE3 = {  # forward, backward, descent, total
    "OPT-125M": (0.4, 0.4, 0.4, 1.2),
    "OPT-350M": (1.2, 1.1, 1.1, 3.4),
    "OPT-1.3B": (3.7, 3.6, 3.5, 10.8),
    "OPT-2.7B": (7.4, 7.2, 7.2, 21.8),
}


@dataclass(frozen=True)
class Sizes:
    d_sim: int
    h_sim: int
    t_sim: int

    @property
    def q_split(self) -> int:
        return self.d_sim**2 // self.h_sim + self.h_sim * self.d_sim

    @property
    def q(self) -> int:
        return 4 * self.q_split + 3 * self.t_sim * self.d_sim // self.h_sim

    @property
    def dh(self) -> int:
        return self.d_sim * self.h_sim


def paper_sizes(d_aux: int, h_sim: int, t_aux: int = 2048, d_sim_factor: int = 4, k: int | None = None) -> Sizes:
    k = d_aux // 4 if k is None else k
    return Sizes(d_sim=d_sim_factor * d_aux, h_sim=h_sim, t_sim=t_aux + k)


def module_rows(s: Sizes) -> dict[str, dict[str, int]]:
    """Per-layer rows of Table 3 (forward, backward, descent, total)."""
    q, qs, dh = s.q, s.q_split, s.dh
    rows = {
        "linear": (q, q, q),
        "layernorm": (q, q + 2 * dh, q),
        "self_attention": (2 * q, 2 * q, 2 * q),
        "activation": (qs, 2 * dh, 0),
        "self_attention_block": (4 * q, 4 * q + 2 * dh, 4 * q),
        "feed_forward_block": (3 * q, 3 * q + 4 * dh, 3 * q),
        "transformer_block": (7 * q, 7 * q + 6 * dh, 7 * q),
    }
    return {name: {"forward": f, "backward": b, "descent": d, "total": f + b + d} for name, (f, b, d) in rows.items()}


def transformer_counts(d_aux: int, n_layer: int, h_sim: int, t_aux: int = 2048) -> dict[str, int]:
    """The 'Transformer' row of Table 3 for an n_layer model."""
    s = paper_sizes(d_aux, h_sim, t_aux)
    forward = 7 * s.q * n_layer + n_layer * s.q_split
    backward = (7 * s.q + 6 * s.dh) * n_layer
    descent = 7 * s.q * n_layer
    return {"forward": forward, "backward": backward, "descent": descent,
            "total_printed_formula": (21 * s.q + 6 * s.dh) * n_layer, "total_sum": forward + backward + descent}


def table3() -> dict[str, dict]:
    return {name: {"counts": transformer_counts(d, n, h), "paper_billions": PAPER_TABLE3[name]}
            for name, (d, n, h) in OPT_MODELS.items()}
