"""Figures of CGT context vectors: the <n_s . n_t> map of cgt-table1 and cgt-text, and a t-SNE of one vector per
document (cgt-text). The metrics themselves are library code: `incontext.train.cgt_metrics`."""

from __future__ import annotations

import numpy as np
import torch

from ..outputs import pyplot


def dot_map_figure(matrix: torch.Tensor, title: str, boundaries: list[int] | None = None):
    fig, ax = pyplot().subplots(figsize=(5, 4.3))
    image = ax.imshow(matrix.numpy(), cmap="viridis", vmin=min(0.0, float(matrix.min())), vmax=1.0)
    for b in boundaries or []:
        ax.axhline(b - 0.5, color="w", lw=0.5)
        ax.axvline(b - 0.5, color="w", lw=0.5)
    ax.set(title=title, xlabel="position t", ylabel="position s")
    fig.colorbar(image, ax=ax, label="<n_s . n_t>")
    fig.tight_layout()
    return fig


def tsne_figure(vectors: np.ndarray, labels: list[str], title: str, seed: int = 0):
    """t-SNE of one vector per document, coloured by its label (topic)."""
    from sklearn.manifold import TSNE

    perplexity = max(2.0, min(30.0, (len(vectors) - 1) / 3))
    points = TSNE(n_components=2, perplexity=perplexity, random_state=seed, init="pca").fit_transform(vectors)
    fig, ax = pyplot().subplots(figsize=(5.5, 4.5))
    for label in sorted(set(labels)):
        chosen = np.array([lab == label for lab in labels])
        ax.scatter(points[chosen, 0], points[chosen, 1], s=8, label=label)
    ax.set(title=title, xticks=[], yticks=[])
    ax.legend(fontsize=7, markerscale=2)
    fig.tight_layout()
    return fig
