"""Does cuSPARSELt's value placement depend on the mask, or only on each value's group
and rank (first or second kept of its group of 4)? If only on (group, rank), the slot
layout can be learned once per shape and a new mask's map computed without compressing."""
import torch
from tilesparse.semi24 import transposable_mask
from tilesparse.semi24 import value_map as value_maps
from tilesparse.semi24.value_map import learn_value_map

for dtype in (torch.bfloat16,):
    for shape in ((4096, 16384), (16384, 4096), (512, 1024)):
        layouts = []
        for trial in range(2):
            mask = transposable_mask(torch.randn(*shape, device="cuda", dtype=dtype))
            for transposed in (False, True):
                value_maps._ROW_MAJOR.clear()  # decode in full every time: the question is the layout
                vm = learn_value_map(mask, dtype, transposed=transposed)
                op = mask.t().contiguous() if transposed else mask
                n, k = shape
                idx = vm.index.long()
                pos = (idx % k) * n + idx // k if transposed else idx  # flat index in the operand
                group = pos // 4
                first = op.reshape(-1, 4).float().cumsum(-1).reshape(-1)[pos] == 1  # rank 0 within its group
                layouts.append((transposed, group * 2 + (~first).long()))
        for t in (False, True):
            a, b = [g for tt, g in layouts if tt == t]
            print(dtype, shape, "T" if t else "W", "slot -> (group, rank) same for two masks:", torch.equal(a, b),
                  "| is identity:", torch.equal(a, torch.arange(a.numel(), device=a.device)))
