"""Draw a layout's block mask with matplotlib (for docs and notebooks).

The module is ``plotting`` rather than ``plot`` so that ``tilesparse.layouts.plot`` is
always the function, never a submodule that shadows it.
"""

from __future__ import annotations

from ..layout import BlockLayout


def plot(layout: BlockLayout, path=None, ax=None, *, title: str | None = None):
    """Draw ``layout.mask`` as an image: one pixel-square per block, stored blocks dark.

    Args:
        layout: the layout to draw (its mask is copied to the CPU).
        path: if given, save the figure there (format from the suffix, e.g. ``.png``).
        ax: matplotlib Axes to draw into; by default a new Figure is made, outside
            pyplot (so no global backend or figure registry is touched), and saved with
            the Agg canvas.
        title: defaults to the shape, block size and density.

    Returns:
        ``(figure, axes)``.
    """
    if not isinstance(layout, BlockLayout):
        raise TypeError(f"layout must be a tilesparse.BlockLayout, got {type(layout).__name__}")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if ax is None:
        # About 5 inches on the longer side, keeping the grid's aspect ratio (within 1:4).
        rows, cols = max(layout.block_rows, 1), max(layout.block_cols, 1)
        scale = 5.0 / max(rows, cols)
        size = (max(cols * scale, 1.25) + 0.8, max(rows * scale, 1.25) + 0.6)
        fig = Figure(figsize=size)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    mask = layout.mask.detach().cpu().numpy()
    ax.imshow(
        mask,
        cmap="Greys",
        vmin=0,
        vmax=1,
        interpolation="nearest",
        aspect="equal",
        extent=(-0.5, layout.block_cols - 0.5, layout.block_rows - 0.5, -0.5),
    )
    ax.set_xlabel("block column")
    ax.set_ylabel("block row")
    if title is None:
        rows, cols = layout.shape
        title = f"{rows}x{cols}, block {layout.block_size}, density {layout.density:.3f}"
    ax.set_title(title)
    if path is not None:
        fig.savefig(path, dpi=100, bbox_inches="tight")
    return fig, ax
