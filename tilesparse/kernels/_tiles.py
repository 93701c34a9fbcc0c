"""Tile-order helpers shared by the block-sparse kernels."""

import triton
import triton.language as tl


@triton.jit
def grouped_tile(tile, num_pid_m, n_out_blocks, GROUP_M: tl.constexpr):
    """(m-tile, output block-column) of a linear tile index in grouped order: GROUP_M
    consecutive m-tiles sweep all block-columns, so the A rows and the weight blocks
    they use stay in L2."""
    pids_per_group = GROUP_M * n_out_blocks
    first_m = (tile // pids_per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % pids_per_group) % group_rows
    pid_n = (tile % pids_per_group) // group_rows
    return pid_m, pid_n
