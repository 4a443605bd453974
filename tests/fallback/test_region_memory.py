"""An ATen region drops each intermediate after its last reader (as eager does), so a
call's peak memory is what is live, not every intermediate; values stay bit-exact."""

import re

import torch

import aot


class Chain(torch.nn.Module):
    """Twelve elementwise steps on one tensor, and a residual read at the end."""

    def forward(self, x):
        y = x
        for i in range(12):
            y = torch.sin(y) * 1.01 + i
        return y + x


def _groups(cm):
    return [f.program for f in cm.host.functions.values() if getattr(f, "program", None)]


def test_a_regions_code_drops_intermediates_after_their_last_reader():
    m, x = Chain().eval(), torch.randn(64, 64)
    cm = aot.compile(m, (x,), fallback="all")
    torch.testing.assert_close(cm(x), m(x), rtol=0, atol=0)  # bit-exact
    (group,) = _groups(cm)
    dropped = re.findall(r"env\[(\d+)\] = None", group.source)
    # every intermediate but the output; the input x (slot 0) only after the last add
    returned = re.search(r"return \[env\[(\d+)\]\]", group.source).group(1)
    assert returned not in dropped and len(dropped) >= 12 * 3
    last_line = group.source.strip().splitlines()[-2]
    assert "env[0] = None" in last_line


def test_peak_memory_of_a_region_call_is_what_is_live():
    m, x = Chain().eval(), torch.randn(1024, 1024)  # 4 MB per intermediate
    cm = aot.compile(m, (x,), fallback="all")
    cm(x)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = cm(x)
    torch.testing.assert_close(out, m(x), rtol=0, atol=0)
    # 36 intermediates of 4 MB each were all alive before; now a few at a time
    peak = _peak_bytes(prof)
    assert peak < 8 * 4 * 2**20, f"peak {peak / 2**20:.0f} MB"


def _peak_bytes(prof) -> int:
    events = sorted((e for e in prof.events() if e.cpu_memory_usage),
                    key=lambda e: e.time_range.start)
    live = peak = 0
    for e in events:
        live += e.cpu_memory_usage
        peak = max(peak, live)
    return peak
