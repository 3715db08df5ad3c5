#!/usr/bin/env python3
"""The GPU's own ceilings through torch, for scripts/gpu-perf.sh: device-to-device copy bandwidth
(bytes read plus written per second), bf16 matrix products at the GEMM shapes bench-ops runs (n =
16, 64, 512, 2048) and
at 8192^3, a bf16 GEMV at the GEMV shape, and causal scaled_dot_product_attention at the
attention shape. Times are CUDA-event medians after warm-up, on random data, with inputs rotated
past L2 where one input set would fit in it. Writes one JSON object to the file named by argv[1].
"""
import json
import sys

import torch


def median_ms(fn, reps=30, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    out = sys.argv[1]
    m, k = int(sys.argv[2]), int(sys.argv[3])
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    res = {
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", 0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gemm_m": m,
        "gemm_k": k,
    }
    # Copy: 2 GiB source, bytes read + bytes written.
    n = 1 << 29
    src = torch.randn(n, device=dev)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    res["copy_bytes_per_s"] = 2 * src.numel() * 4 / (ms * 1e-3)
    del src, dst
    # bf16 matmul: the bench-ops GEMM shapes (m x k weights, n = 16, 64, 512 and 2048 columns)
    # and 8192^3.
    sets = 4
    ws = [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    i = [0]
    for n in (16, 64, 512, 2048):
        x = torch.randn(k, n, device=dev, dtype=torch.bfloat16)

        def mm():
            i[0] += 1
            return ws[i[0] % sets] @ x

        ms = median_ms(mm)
        res[f"bf16_gemm_n{n}_flops"] = 2 * m * n * k / (ms * 1e-3)
    xv = torch.randn(k, 1, device=dev, dtype=torch.bfloat16)

    def mv():
        i[0] += 1
        return ws[i[0] % sets] @ xv

    ms = median_ms(mv)
    res["bf16_gemv_bytes_per_s"] = (m * k * 2) / (ms * 1e-3)
    del ws
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    ms = median_ms(lambda: a @ b, reps=10)
    res["bf16_gemm_8192_flops"] = 2 * 8192**3 / (ms * 1e-3)
    del a, b
    # Attention: d = 128, 32 query / 8 KV heads, 2048 causal positions, f16.
    q = torch.randn(1, 32, 2048, 128, device=dev, dtype=torch.float16)
    kk = torch.randn(1, 8, 2048, 128, device=dev, dtype=torch.float16)
    vv = torch.randn(1, 8, 2048, 128, device=dev, dtype=torch.float16)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    ms = median_ms(lambda: sdpa(q, kk, vv, is_causal=True, enable_gqa=True))
    res["sdpa_causal_2048_ms"] = ms
    ms = median_ms(lambda: sdpa(q, kk, vv, is_causal=False, enable_gqa=True))
    res["sdpa_full_2048_ms"] = ms
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
