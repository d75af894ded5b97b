//! GPU specifications for the hardware-info block of a prompt, looked up from a device name.
//!
//! Figures come from the vendors' public data sheets and architecture whitepapers (CUDA programming
//! guide for the per-SM limits). Tensor-core throughputs are *dense* peaks: data sheets often print
//! the doubled "with sparsity" figure, which a KernelBench kernel never reaches, so we halve those.
//! FP16/BF16 are tensor-core rates with FP32 accumulation, the rate a numerically careful kernel sees.
//! Where a value is not from a data sheet the entry's `note` says where it is from.

/// Specifications of one GPU model. All throughput figures are peak, in TFLOP/s.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSpec {
    /// Canonical model name, e.g. `"H100 SXM"`.
    pub model: &'static str,
    pub architecture: &'static str,
    /// CUDA compute capability, e.g. `"9.0"`.
    pub compute_capability: &'static str,
    pub memory_gb: u32,
    pub memory_type: &'static str,
    /// Peak DRAM bandwidth in GB/s.
    pub memory_bandwidth_gbs: u32,
    pub sm_count: u32,
    /// Non-tensor FP32.
    pub fp32_tflops: f64,
    /// Dense TF32 tensor-core rate; `None` where the architecture has no TF32 tensor cores.
    pub tf32_tflops: Option<f64>,
    /// Dense FP16 tensor-core rate (FP32 accumulate).
    pub fp16_tflops: f64,
    /// Dense BF16 tensor-core rate; `None` where BF16 tensor cores do not exist.
    pub bf16_tflops: Option<f64>,
    pub l2_mb: u32,
    /// Largest shared-memory carve-out of one SM, in KB.
    pub shared_mem_per_sm_kb: u32,
    /// Largest shared memory one block may opt into, in KB.
    pub shared_mem_per_block_kb: u32,
    /// 32-bit registers per SM.
    pub registers_per_sm: u32,
    pub max_threads_per_sm: u32,
    /// Where a figure does not come from a data sheet, or needs a caveat.
    pub note: Option<&'static str>,
    /// Token patterns that identify this model in a device name; one pattern matches when all its
    /// tokens are among the name's tokens. See [`lookup`].
    patterns: &'static [&'static [&'static str]],
}

/// Limits that are the same on every GPU in the table; kept apart so the table stays readable.
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;
pub const WARP_SIZE: u32 = 32;
pub const MAX_REGISTERS_PER_THREAD: u32 = 255;

const HOPPER_SMEM: (u32, u32) = (228, 227);
const AMPERE_GA100_SMEM: (u32, u32) = (164, 163);
const AMPERE_GA10X_SMEM: (u32, u32) = (100, 99);
const ADA_SMEM: (u32, u32) = (100, 99);
const REGS: u32 = 65_536;

#[allow(
    clippy::too_many_arguments,
    reason = "one row of the specs table, its columns in the table's order"
)]
const fn spec(
    model: &'static str,
    architecture: &'static str,
    compute_capability: &'static str,
    memory: (u32, &'static str, u32),
    sm_count: u32,
    flops: (f64, Option<f64>, f64, Option<f64>),
    l2_mb: u32,
    smem: (u32, u32),
    max_threads_per_sm: u32,
    note: Option<&'static str>,
    patterns: &'static [&'static [&'static str]],
) -> GpuSpec {
    GpuSpec {
        model,
        architecture,
        compute_capability,
        memory_gb: memory.0,
        memory_type: memory.1,
        memory_bandwidth_gbs: memory.2,
        sm_count,
        fp32_tflops: flops.0,
        tf32_tflops: flops.1,
        fp16_tflops: flops.2,
        bf16_tflops: flops.3,
        l2_mb,
        shared_mem_per_sm_kb: smem.0,
        shared_mem_per_block_kb: smem.1,
        registers_per_sm: REGS,
        max_threads_per_sm,
        note,
        patterns,
    }
}

/// The table. Order matters: the first entry with a matching pattern wins, so variants that share a
/// chip token (H100 NVL, H100 PCIe) come before the plain name (H100 = the SXM part).
static GPUS: &[GpuSpec] = &[
    spec(
        "H100 NVL",
        "Hopper",
        "9.0",
        (94, "HBM3", 3900),
        132,
        (60.0, Some(418.0), 836.0, Some(836.0)),
        50,
        HOPPER_SMEM,
        2048,
        None,
        &[&["H100", "NVL"]],
    ),
    spec(
        "H100 PCIe",
        "Hopper",
        "9.0",
        (80, "HBM2e", 2000),
        114,
        (51.0, Some(378.0), 756.0, Some(756.0)),
        50,
        HOPPER_SMEM,
        2048,
        None,
        &[&["H100", "PCIE"]],
    ),
    spec(
        "H100 SXM",
        "Hopper",
        "9.0",
        (80, "HBM3", 3350),
        132,
        (67.0, Some(495.0), 989.0, Some(989.0)),
        50,
        HOPPER_SMEM,
        2048,
        None,
        &[&["H100"]],
    ),
    spec(
        "H200 NVL",
        "Hopper",
        "9.0",
        (141, "HBM3e", 4800),
        132,
        (60.0, Some(418.0), 836.0, Some(836.0)),
        60,
        HOPPER_SMEM,
        2048,
        Some(
            "L2 size as PyTorch reports it for the H200 SXM part; the data sheet does not list it",
        ),
        &[&["H200", "NVL"]],
    ),
    spec(
        "H200 SXM",
        "Hopper",
        "9.0",
        (141, "HBM3e", 4800),
        132,
        (67.0, Some(495.0), 989.0, Some(989.0)),
        60,
        HOPPER_SMEM,
        2048,
        Some("L2 size as PyTorch reports it on the device; the data sheet does not list it"),
        &[&["H200"]],
    ),
    spec(
        "B200",
        "Blackwell",
        "10.0",
        (180, "HBM3e", 8000),
        148,
        (75.0, Some(1125.0), 2250.0, Some(2250.0)),
        126,
        HOPPER_SMEM,
        2048,
        Some(
            "per-GPU rates derived from the 8-GPU HGX B200 data sheet; L2 size as reported by \
             device queries",
        ),
        &[&["B200"]],
    ),
    spec(
        "A100 80GB PCIe",
        "Ampere",
        "8.0",
        (80, "HBM2e", 1935),
        108,
        (19.5, Some(156.0), 312.0, Some(312.0)),
        40,
        AMPERE_GA100_SMEM,
        2048,
        None,
        &[&["A100", "80GB", "PCIE"]],
    ),
    spec(
        "A100 80GB SXM",
        "Ampere",
        "8.0",
        (80, "HBM2e", 2039),
        108,
        (19.5, Some(156.0), 312.0, Some(312.0)),
        40,
        AMPERE_GA100_SMEM,
        2048,
        None,
        &[&["A100", "80GB"]],
    ),
    spec(
        "A100 40GB",
        "Ampere",
        "8.0",
        (40, "HBM2", 1555),
        108,
        (19.5, Some(156.0), 312.0, Some(312.0)),
        40,
        AMPERE_GA100_SMEM,
        2048,
        None,
        &[&["A100"]],
    ),
    spec(
        "L40S",
        "Ada Lovelace",
        "8.9",
        (48, "GDDR6", 864),
        142,
        (91.6, Some(183.0), 362.0, Some(362.0)),
        96,
        ADA_SMEM,
        1536,
        None,
        &[&["L40S"]],
    ),
    spec(
        "L4",
        "Ada Lovelace",
        "8.9",
        (24, "GDDR6", 300),
        58,
        (30.3, Some(60.0), 121.0, Some(121.0)),
        48,
        ADA_SMEM,
        1536,
        None,
        &[&["L4"]],
    ),
    spec(
        "A10G",
        "Ampere",
        "8.6",
        (24, "GDDR6", 600),
        80,
        (35.0, Some(35.0), 70.0, Some(70.0)),
        6,
        AMPERE_GA10X_SMEM,
        1536,
        Some(
            "AWS variant without an NVIDIA data sheet; figures from AWS's description \
             (80 SMs, 320 tensor cores) and published comparisons",
        ),
        &[&["A10G"]],
    ),
    spec(
        "A10",
        "Ampere",
        "8.6",
        (24, "GDDR6", 600),
        72,
        (31.2, Some(62.5), 125.0, Some(125.0)),
        6,
        AMPERE_GA10X_SMEM,
        1536,
        None,
        &[&["A10"]],
    ),
    spec(
        "GeForce RTX 4090",
        "Ada Lovelace",
        "8.9",
        (24, "GDDR6X", 1008),
        128,
        (82.6, Some(82.6), 165.2, Some(165.2)),
        72,
        ADA_SMEM,
        1536,
        Some("FP16 tensor rate doubles (330 TFLOP/s) with FP16 accumulation"),
        &[&["RTX", "4090"], &["4090"]],
    ),
    spec(
        "T4",
        "Turing",
        "7.5",
        (16, "GDDR6", 320),
        40,
        (8.1, None, 65.0, None),
        4,
        (64, 64),
        1024,
        Some("no TF32 or BF16 tensor cores; FP16 tensor rate is the mixed-precision peak"),
        &[&["T4"]],
    ),
];

/// Upper-case alphanumeric tokens of a device name: `"NVIDIA A100-SXM4-80GB"` →
/// `["NVIDIA", "A100", "SXM4", "80GB"]`. Matching on whole tokens rather than raw substrings keeps
/// `L4` from matching `L40S`, `A10` from matching `A100`, and `H200` from matching `GH200`.
fn tokens(name: &str) -> Vec<String> {
    name.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(|t| t.to_ascii_uppercase())
        .collect()
}

/// The specification for a device name as torch (`torch.cuda.get_device_name`) or nvidia-smi print
/// it, e.g. `"NVIDIA H100 80GB HBM3"`; `None` for a GPU that is not in the table.
pub fn lookup(device_name: &str) -> Option<&'static GpuSpec> {
    let toks = tokens(device_name);
    GPUS.iter().find(|g| {
        g.patterns
            .iter()
            .any(|pat| pat.iter().all(|p| toks.iter().any(|t| t == p)))
    })
}

/// Every GPU in the table, in lookup order.
pub fn all() -> &'static [GpuSpec] {
    GPUS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(name: &str) -> Option<&'static str> {
        lookup(name).map(|g| g.model)
    }

    #[test]
    fn device_names_resolve_to_the_right_variant() {
        for (name, want) in [
            ("NVIDIA H100 80GB HBM3", "H100 SXM"),
            ("NVIDIA H100 PCIe", "H100 PCIe"),
            ("NVIDIA H100 NVL", "H100 NVL"),
            ("NVIDIA H200", "H200 SXM"),
            ("NVIDIA H200 NVL", "H200 NVL"),
            ("NVIDIA B200", "B200"),
            ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
            ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
            ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
            ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
            ("NVIDIA L40S", "L40S"),
            ("NVIDIA L4", "L4"),
            ("NVIDIA A10G", "A10G"),
            ("NVIDIA A10", "A10"),
            ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090"),
            ("Tesla T4", "T4"),
            ("nvidia h100 80gb hbm3", "H100 SXM"),
        ] {
            assert_eq!(model(name), Some(want), "{name}");
        }
    }

    #[test]
    fn near_misses_do_not_match() {
        for name in [
            "NVIDIA GH200 480GB",
            "NVIDIA L40",
            "NVIDIA GeForce RTX 3090",
            "AMD Instinct MI300X",
            "",
            "cpu",
        ] {
            assert_eq!(model(name), None, "{name}");
        }
    }

    #[test]
    fn table_is_sane() {
        for g in all() {
            assert!(g.sm_count > 0 && g.memory_gb > 0 && g.memory_bandwidth_gbs > 0);
            assert!(g.fp16_tflops >= g.fp32_tflops, "{}", g.model);
            assert!(
                g.shared_mem_per_block_kb <= g.shared_mem_per_sm_kb,
                "{}",
                g.model
            );
            assert!(!g.patterns.is_empty(), "{}", g.model);
            // Every entry must be reachable: its own model name resolves to it.
            assert_eq!(
                lookup(&format!("NVIDIA {}", g.model)).map(|x| x.model),
                Some(g.model)
            );
        }
    }
}
