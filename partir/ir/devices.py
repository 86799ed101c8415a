"""Device catalog: peak FLOP/s, HBM size and bandwidth, interconnect bandwidth.

Numbers are per chip, from the vendors' public spec sheets (sources beside each entry).
FLOP/s are dense bf16 peaks; the cost model uses them for every dtype, so a step time is an
estimate of a well-tuned bf16 run. Link bandwidths are per direction along one mesh axis.
GPUs sit in nodes of `node_size`: a mesh axis whose devices all fit in a node uses NVLink,
one that spans nodes uses the network.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

GiB = 1024**3
GB = 10**9


@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    flops: float  # peak FLOP/s
    hbm: int  # bytes
    hbm_bandwidth: float  # bytes/s
    link_bandwidth: float  # bytes/s per direction, within a node (or the whole ICI torus)
    latency: float = 1e-6  # seconds per collective step (the alpha of the alpha-beta model)
    node_size: int | None = None  # devices per node on GPUs; None: one interconnect
    network_bandwidth: float | None = None  # bytes/s per device across nodes
    links: Mapping[str, float] = dataclasses.field(default_factory=dict)  # per-axis overrides
    # The device's all-gather concatenates along the major-most dim of the layout (seen on
    # XLA:CPU): gathering a dim behind a longer one makes a transposed buffer that XLA copies
    # into the default layout, and a loop slice of a layer stack that is gathered makes XLA
    # copy the whole stack into the gathered layout once, before the loop. Not seen on TPU
    # or GPU builds, so not modelled for them.
    gathers_major_most: bool = False
    # The device runs a reduce-scatter as an all-reduce and a slice (XLA:CPU): the combined
    # reduction's results are whole arrays, all live at once beside the partial sums, and a
    # result whose readers all fuse the slice in (pointwise, layout, reductions) stays whole
    # while it lives.
    scatters_whole: bool = False
    # The device's schedule runs each kernel as soon as the kernels it reads have run,
    # breadth first (XLA:CPU's default scheduler; partir.ir.schedule.KernelGraph). TPU and
    # GPU schedules keep program order as far as the model goes.
    schedules_breadth_first: bool = False
    # The device's compiler merges a checkpoint region's recompute with the forward pass
    # (drops the optimization barrier JAX puts on the region's backward operands): the step
    # allocates as if nothing were rematerialised. Else the recompute waits for the
    # cotangent. None: as the installed XLA:CPU does (`merges_recompute`).
    merges_recompute_by_cse: bool | None = False
    # From this many f32 elements per device, the device's reductions run as library kernels
    # that take no broadcast of a computed value in (XLA:CPU: YNNPACK, from 4096): a norm's
    # `x - mean` is then a buffer the reductions read, while its other readers compute it
    # again. None: reductions take their producers in at every size.
    library_reductions_from: int | None = None
    # The device's convolutions read their operands in one layout (XLA:CPU: batch, spatial,
    # feature; kernels spatial, in, out): an operand cut otherwise is copied first, as soon
    # as it is made (the activations a kernel gradient reads, copied in the forward pass).
    convs_need_layout: bool = False
    # The device's compiler calls f32 and f16 division, square roots and exponentials cheap
    # and computes them again in every kernel that reads them (XLA:GPU's
    # GpuInstructionFusion::IsExpensive): a softmax's `exp` is then no buffer of its own.
    # Elsewhere (XLA:CPU, the generic rule) such an op with several readers is a buffer.
    cheap_f32_math: bool = False

    def merges_recompute(self) -> bool:
        """Whether checkpoint regions' recompute is merged with the forward pass."""
        if self.merges_recompute_by_cse is None:
            from partir.ir.xla.remat import cpu_merges_recompute

            return cpu_merges_recompute()
        return self.merges_recompute_by_cse

    def axis_bandwidths(self, mesh: Mapping[str, int]) -> dict[str, float]:
        """Bandwidth of each mesh axis. Axes are laid out major first, so the last axes
        are the ones that stay within a node."""
        out: dict[str, float] = {}
        inner = 1
        for name in reversed(list(mesh)):
            inner *= mesh[name]
            if name in self.links:
                out[name] = self.links[name]
            elif self.node_size is not None and inner > self.node_size:
                out[name] = self.network_bandwidth or self.link_bandwidth
            else:
                out[name] = self.link_bandwidth
        return {name: out[name] for name in mesh}

    def with_links(self, links: Mapping[str, float]) -> Device:
        return dataclasses.replace(self, links={**self.links, **links})


CATALOG: dict[str, Device] = {
    d.name: d
    for d in [
        # Cloud TPU system architecture pages (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e):
        # v4: 275 TFLOP/s bf16, 32 GiB HBM2 at 1,200 GB/s, ICI 6 links x 50 GB/s.
        Device("tpu-v4", 275e12, 32 * GiB, 1200 * GB, 50 * GB),
        # v5e: 197 TFLOP/s bf16, 16 GiB HBM2e at 819 GB/s, ICI 1,600 Gbit/s over 4 links.
        Device("tpu-v5e", 197e12, 16 * GiB, 819 * GB, 50 * GB),
        # v5p: 459 TFLOP/s bf16, 95 GiB HBM2e at 2,765 GB/s, ICI 4,800 Gbit/s over 6 links.
        Device("tpu-v5p", 459e12, 95 * GiB, 2765 * GB, 100 * GB),
        # v6e (Trillium): 918 TFLOP/s bf16, 32 GiB at 1,640 GB/s, ICI 3,584 Gbit/s, 4 links.
        Device("tpu-v6e", 918e12, 32 * GiB, 1640 * GB, 112 * GB),
        # NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense, 80 GB HBM2e at 2,039 GB/s,
        # NVLink 600 GB/s (300 GB/s per direction), 8 per node, HDR InfiniBand 25 GB/s.
        Device(
            "a100-80g", 312e12, 80 * GB, 2039 * GB, 300 * GB, 2e-6, 8, 25 * GB, cheap_f32_math=True
        ),
        # H100 SXM datasheet: 989 TFLOP/s bf16 dense, 80 GB HBM3 at 3,350 GB/s,
        # NVLink 900 GB/s (450 per direction), 8 per node, NDR InfiniBand 50 GB/s.
        Device("h100", 989e12, 80 * GB, 3350 * GB, 450 * GB, 2e-6, 8, 50 * GB, cheap_f32_math=True),
        # H200 datasheet: as H100 with 141 GB HBM3e at 4,800 GB/s.
        Device(
            "h200", 989e12, 141 * GB, 4800 * GB, 450 * GB, 2e-6, 8, 50 * GB, cheap_f32_math=True
        ),
        # B200 (DGX B200 datasheet): 2,250 TFLOP/s bf16 dense, 180 GB HBM3e at 8 TB/s,
        # NVLink 5 1,800 GB/s (900 per direction), 8 per node, 50 GB/s network.
        Device(
            "b200", 2250e12, 180 * GB, 8000 * GB, 900 * GB, 2e-6, 8, 50 * GB, cheap_f32_math=True
        ),
        # A laptop-class CPU "device", for examples that run here: ~1 TFLOP/s f32 vector
        # peak, 16 GiB, ~50 GB/s memory, ~10 GB/s between fake devices.
        Device(
            "cpu",
            1e12,
            16 * GiB,
            50 * GB,
            10 * GB,
            5e-6,
            gathers_major_most=True,
            scatters_whole=True,
            schedules_breadth_first=True,
            merges_recompute_by_cse=None,  # jaxlib 0.10 merges, 0.12 keeps the recompute
            library_reductions_from=4096,
            convs_need_layout=True,
        ),
    ]
}


def get_device(name: str) -> Device:
    """A catalog device by name; the error lists the names."""
    try:
        return CATALOG[name]
    except KeyError:
        raise ValueError(f"unknown device {name!r}; known devices: {', '.join(CATALOG)}") from None
