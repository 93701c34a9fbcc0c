"""tilesparse.layouts.plot: draws a layout's block mask, one cell per block."""

import pytest
import torch

from tilesparse import BlockLayout, layouts

B = 4  # block size: the plot only sees the block grid


class TestPlot:
    def test_writes_a_png_and_returns_the_figure(self, tmp_path):
        from matplotlib.axes import Axes
        from matplotlib.figure import Figure

        layout = layouts.barabasi_albert(48 * B, 80 * B, B, m=2, seed=1, diagonal=True)
        path = tmp_path / "layout.png"
        fig, ax = layouts.plot(layout, path)
        assert isinstance(fig, Figure) and isinstance(ax, Axes) and ax.figure is fig
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        # the image is the mask itself, one cell per block
        image = ax.images[0].get_array()
        assert image.shape == (48, 80)
        assert (image.astype(bool) == layout.mask.numpy()).all()
        assert "density" in ax.get_title()

    def test_draws_into_given_axes_without_saving(self, tmp_path):
        from matplotlib.figure import Figure

        fig = Figure()
        ax = fig.add_subplot(1, 2, 2)
        got_fig, got_ax = layouts.plot(layouts.block_diagonal(32, 64, 8), ax=ax, title="diag")
        assert got_fig is fig and got_ax is ax and ax.get_title() == "diag"
        assert list(tmp_path.iterdir()) == []

    @pytest.mark.parametrize("mask", [torch.zeros(3, 5, dtype=torch.bool), torch.ones(1, 1, dtype=torch.bool)],
                             ids=["empty", "single"])
    def test_edge_layouts(self, tmp_path, mask):
        layouts.plot(BlockLayout(mask, 8), tmp_path / "edge.png")
        assert (tmp_path / "edge.png").stat().st_size > 0

    def test_rejects_non_layout(self):
        with pytest.raises(TypeError, match="layout"):
            layouts.plot(torch.ones(2, 2, dtype=torch.bool))
