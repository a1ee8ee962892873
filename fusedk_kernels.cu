// fusedk_kernels.cu - every GPU kernel of fusedk and its launcher.
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a
//             -gencode=arch=compute_80,code=[sm_80,compute_80] -c fusedk_kernels.cu
// and define FUSEDK_CUDA in the file that defines FUSEDK_IMPLEMENTATION (see fusedk.h). The
// public entry points live in the header; they validate every argument and hand this file a
// plain, already-checked argument struct naming the op, so nothing here re-validates tensors
// or guesses which op it runs.
//
// Parts: a build may compile this file once per kernel family, in parallel, by defining one or
// more of FUSEDK_ONLY_NORM, FUSEDK_ONLY_ELEMENTWISE (with [sampler]), FUSEDK_ONLY_POSITION,
// FUSEDK_ONLY_LINEAR (with [gemm]), FUSEDK_ONLY_ATTENTION, FUSEDK_ONLY_LOWRANK, FUSEDK_ONLY_CONV and
// FUSEDK_ONLY_RUNTIME (fusedk__cuda_alloc/free, _stream_wait, _device_count, _info, _shutdown) for
// each object. Such an object holds the shared helpers ([runtime] to [tile]) and the named families
// with their [entry] functions; the eight parts together define every fusedk__cuda_* function once
// (meson.build links them into libfusedk). The linear part calls into two others: its act pass
// into fusedk__cuda_elementwise, linear_lowrank into fusedk__cuda_lowrank and the low-rank
// backward into fusedk__cuda_lowrank_grad_pass (the lowrank part's one-pass kernel; its GEMM path
// runs on [gemm], in the linear part). With none of them defined the file compiles whole: a
// drop-in build needs none.
//
// CONTENTS (each section opens with its tag; fusedk.h, tests/ and bench/ use the same tags)
//   [runtime]   errors, device guard, per-device attributes, the >48 KB shared-memory opt-in
//   [dispatch]  a compile-time variant from a runtime value: element type, power-of-two widths
//   [numerics]  float <-> float32 conversions, rounding points; the activations (elementwise, linear)
//   [memory]    16-byte vectors; loads and stores named by cache policy; per-thread row walks;
//               Hopper bulk copies (cp.async.bulk) counted by mbarriers
//   [reduce]    warp and row-group sums
//   [tile]      the tensor-core layer: swizzled tiles in shared memory, cp.async tile loads
//               (load_tile) and their stage ring (ring_run); the warp-level MMA layer: the
//               instruction by element type (MmaOp), each operand's lane addressing
//               (WarpOperand: A or B, K- or N-major), a warp tile += A B (warp_mma); Hopper: TMA
//               tensor maps (tmap_bshd) and their swizzle (swz128), TMA loads, wgmma (wgmma_ss,
//               wgmma_rs), setmaxnreg, named barriers
//   [norm]      rmsnorm, layernorm, adaln, residual_tanh_gated_rmsnorm: norm_rows (entry points
//               norm_rows_kernel, norm_rows_reg_kernel) and fusedk__cuda_norm (launcher); the
//               tuning hook (FUSEDK_TUNING builds only)
//   [elementwise] act, silu_fma, gated_residual, glu, glu_pair and [sampler] diffusion_step:
//               elementwise_rows_kernel
//   [position]  rope, qk_norm_rope and qk_norm_rope_int8: on Hopper qkv_tma_kernel (rows of 4
//               tokens through bulk copies); else rope_kernel (q and k in one launch) and
//               qkv_kernel (q, k, v rows); their Q8 form writes int8 rows with a head's scale;
//               the table builders (rope_table_kernel)
//   [gemm]      cuBLASLt GEMMs for any family: plans, tuning, per-stream workspace and scratch
//               (LtState), gemm_locked (a family's entry: device, lock), lt_arena, lt_matmul
//   [linear]    linear, linear_backward on [gemm]: the act and bias passes, linear_dz_kernel and
//               linear_db_kernel; the 8-bit rows (quant_kernel, quant_block_kernel: quantize_fp8,
//               dequantize_fp8, glu_fp8, quantize_int8), linear_fp8 on [gemm], and linear_w8's
//               matrix-vector kernel (linear_w8_kernel)
//   [attention] flash attention forward: attn_kernel (sm_80+: warp_mma, a stage ring, online
//               softmax) and attn_tma_kernel (sm_90a: producer attn_tma_produce, the consumers'
//               mainloop attn_tma_mainloop taking turns on wgmma, the epilogue's stores; the
//               producer's ring and the consumers' pipeline shared with attention_int8's
//               attn_i8_kernel; its quantization passes attn_i8_stats (and attn_i8_stat_sums),
//               attn_i8_rows, attn_i8_vcopy where TMA cannot read v)
//   [lowrank]   lowrank_update: lowrank_mma_kernel (f16/bf16: x v (lr_h_mainloop) and h u_t
//               (lr_out_mainloop) on warp_mma, h in registers) and lowrank_fma_kernel (float32
//               and unaligned views: CUDA cores); the backward's one-pass lowrank_grad_kernel.
//               One section over two build parts: the shapes (both), the routing and the
//               GEMM-path backward (the linear part: [gemm]), the kernels (the lowrank part)
//   [conv]      conv: an implicit GEMM a tap and 64 channels at a time; on sm_90a conv_tma_kernel
//               (persistent; each tap's input patch a TMA box, wgmma, a producer thread), else conv_kernel
//               (the taps gathered by cp.async) on wgmma (sm_90a) or warp_mma; fold_batchnorm's
//               fold_kernel; group_norm's gn_sums_kernel, gn_stats_kernel, gn_apply_kernel;
//               channel_rmsnorm's crms_kernel
//   [entry]     fusedk__cuda_norm, fusedk__cuda_elementwise, fusedk__cuda_rope, fusedk__cuda_rope_table,
//               fusedk__cuda_linear, fusedk__cuda_linear_lowrank, fusedk__cuda_lowrank_grad,
//               fusedk__cuda_shutdown, fusedk__cuda_attention, fusedk__cuda_lowrank,
//               fusedk__cuda_lowrank_grad_pass, fusedk__cuda_conv, fusedk__cuda_fold_batchnorm,
//               fusedk__cuda_group_norm, fusedk__cuda_channel_rmsnorm,
//               fusedk__cuda_alloc/free, fusedk__cuda_stream_wait, fusedk__cuda_device_count, fusedk__cuda_info
#define FUSEDK__INTERNAL
#include "fusedk.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <cooperative_groups.h>
#include <cudaTypedefs.h> // CUtensorMap, the cuTensorMapEncodeTiled type: types only, no libcuda
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

// The parts this object compiles (see Parts above): all of them unless FUSEDK_ONLY_* names some.
#if defined(FUSEDK_ONLY_NORM) || defined(FUSEDK_ONLY_ELEMENTWISE) || defined(FUSEDK_ONLY_POSITION) || \
    defined(FUSEDK_ONLY_LINEAR) || defined(FUSEDK_ONLY_ATTENTION) || defined(FUSEDK_ONLY_LOWRANK) ||        \
    defined(FUSEDK_ONLY_CONV) || defined(FUSEDK_ONLY_RUNTIME)
#define FUSEDK__PART_ALL 0
#else
#define FUSEDK__PART_ALL 1
#endif
#if FUSEDK__PART_ALL || defined(FUSEDK_ONLY_NORM)
#define FUSEDK__PART_NORM 1
#else
#define FUSEDK__PART_NORM 0
#endif
#if FUSEDK__PART_ALL || defined(FUSEDK_ONLY_ELEMENTWISE)
#define FUSEDK__PART_ELEMENTWISE 1
#else
#define FUSEDK__PART_ELEMENTWISE 0
#endif
#if FUSEDK__PART_ALL || defined(FUSEDK_ONLY_POSITION)
#define FUSEDK__PART_POSITION 1
#else
#define FUSEDK__PART_POSITION 0
#endif
#if FUSEDK__PART_ALL || defined(FUSEDK_ONLY_LINEAR)
#define FUSEDK__PART_LINEAR 1
#else
#define FUSEDK__PART_LINEAR 0
#endif
#if FUSEDK__PART_ALL || defined(FUSEDK_ONLY_ATTENTION)
#define FUSEDK__PART_ATTENTION 1
#else
#define FUSEDK__PART_ATTENTION 0
#endif
#if FUSEDK__PART_ALL || defined(FUSEDK_ONLY_LOWRANK)
#define FUSEDK__PART_LOWRANK 1
#else
#define FUSEDK__PART_LOWRANK 0
#endif
#if FUSEDK__PART_ALL || defined(FUSEDK_ONLY_CONV)
#define FUSEDK__PART_CONV 1
#else
#define FUSEDK__PART_CONV 0
#endif
#if FUSEDK__PART_ALL || defined(FUSEDK_ONLY_RUNTIME)
#define FUSEDK__PART_RUNTIME 1
#else
#define FUSEDK__PART_RUNTIME 0
#endif

// A part leaves some shared helpers unreferenced (other parts use them): nvcc's "declared but
// never referenced" (177) is off for the shared helpers there, and stays on in the whole file.
#if !FUSEDK__PART_ALL
#pragma nv_diag_suppress 177
#endif

namespace {

// ---------------------------------------------------------------------------------------------
// [runtime] errors, device guard, per-device attributes, launch attributes
// ---------------------------------------------------------------------------------------------

fusedk_status cuda_fail(cudaError_t e, const char *op, const char *what) {
  return fusedk__fail(e == cudaErrorMemoryAllocation ? FUSEDK_ERR_OUT_OF_MEMORY : FUSEDK_ERR_CUDA,
                      "%s: %s failed: %s (%s)", op, what, cudaGetErrorName(e), cudaGetErrorString(e));
}

// Runs the op on `device_id` and restores the caller's current device.
struct DeviceGuard {
  int prev = -1;
  cudaError_t err = cudaSuccess;
  explicit DeviceGuard(int id) {
    err = cudaGetDevice(&prev);
    if (err == cudaSuccess && prev != id) err = cudaSetDevice(id);
    else prev = -1;
  }
  ~DeviceGuard() {
    if (prev >= 0) cudaSetDevice(prev);
  }
};

// A launch's CUDA error reported with the op.
fusedk_status on_error(cudaError_t e, const char *op) {
  return e == cudaSuccess ? FUSEDK_OK : cuda_fail(e, op, "kernel launch");
}

// One op's launch on device_id: the device selected for it; launch() returns a cudaError_t (a
// CUDA error reported with the op) or a fusedk_status (the linear ops: cuBLASLt's too).
template <typename F> fusedk_status on_device(int32_t device_id, const char *op, F &&launch) {
  DeviceGuard guard(device_id);
  if (guard.err != cudaSuccess) return cuda_fail(guard.err, op, "selecting the device");
  if constexpr (std::is_same<decltype(launch()), fusedk_status>::value) return launch();
  else return on_error(launch(), op);
}

constexpr int kMaxDevices = 64; // per-device caches below; other ordinals take the defaults

// A device attribute, read once per device (these never change; racing readers store the same
// value); 0 where unknown.
template <cudaDeviceAttr A> int device_attr(int device_id) {
  static std::atomic<int64_t> cache[kMaxDevices]; // value + 1: a known 0 is cached too
  if (device_id < 0 || device_id >= kMaxDevices) return 0;
  const int64_t c = cache[device_id].load(std::memory_order_relaxed);
  if (c) return (int)(c - 1);
  int v = 0;
  if (cudaDeviceGetAttribute(&v, A, device_id) != cudaSuccess) {
    cudaGetLastError(); // not sticky
    return 0;
  }
  cache[device_id].store((int64_t)v + 1, std::memory_order_relaxed);
  return v;
}
// the most shared memory a block may opt into (48 KB where unknown)
size_t device_smem_optin(int device_id) {
  return (size_t)std::max(device_attr<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device_id), 48 << 10);
}
// the multiprocessors (grid sizes of grid-stride kernels); 132 where unknown
int device_sms(int device_id) {
  const int v = device_attr<cudaDevAttrMultiProcessorCount>(device_id);
  return v > 0 ? v : 132;
}

// Allocations while a stream is being captured go through the relaxed capture mode (cudaMalloc
// is not a stream operation; the memory outlives the graph).
struct RelaxedCapture {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode); }
};

// Which thread's stream s is: cudaStreamPerThread names a different stream in each thread
size_t stream_thread(cudaStream_t s) {
  return s == cudaStreamPerThread ? std::hash<std::thread::id>()(std::this_thread::get_id()) : 0;
}

// A device buffer a (device, stream) that grows to the largest request, its first `zeroed` bytes
// zero when it is made (counters its kernels leave at zero again). Work queued on one stream runs
// in order, so the stream's calls share it; a CUDA graph keeps the buffer of the stream it was
// captured on, so it must not run concurrently with that stream's other users (as cuBLAS
// workspaces). Outgrown buffers live until release(): graphs captured earlier still use them.
struct StreamBuffers {
  struct Buf {
    int dev;
    cudaStream_t stream;
    size_t thread, bytes;
    void *p;
  };
  static constexpr int kMax = 64;
  std::mutex mu;
  Buf bufs[kMax] = {};
  int n = 0;
  std::vector<std::pair<int, void *>> retired;

  cudaError_t get(int dev, cudaStream_t s, size_t bytes, size_t zeroed, void **out) {
    std::lock_guard<std::mutex> lock(mu);
    const size_t thread = stream_thread(s);
    Buf *b = nullptr;
    for (int i = 0; i < n && !b; ++i)
      if (bufs[i].dev == dev && bufs[i].stream == s && bufs[i].thread == thread) b = &bufs[i];
    if (!b) {
      if (n == kMax) return cudaErrorLaunchOutOfResources;
      b = &bufs[n++];
      *b = Buf{dev, s, thread, 0, nullptr};
    }
    if (bytes > b->bytes) {
      bytes = std::max(bytes, b->bytes + b->bytes / 2);
      RelaxedCapture relaxed;
      void *p = nullptr;
      cudaStream_t z = nullptr; // a private stream: the caller's may be capturing
      cudaError_t e = cudaMalloc(&p, bytes);
      if (e == cudaSuccess && zeroed) e = cudaStreamCreateWithFlags(&z, cudaStreamNonBlocking);
      if (e == cudaSuccess && zeroed) e = cudaMemsetAsync(p, 0, zeroed, z);
      if (e == cudaSuccess && zeroed) e = cudaStreamSynchronize(z);
      if (z) cudaStreamDestroy(z);
      if (e != cudaSuccess) {
        if (p) cudaFree(p);
        return e;
      }
      if (b->p) retired.emplace_back(dev, b->p);
      b->p = p, b->bytes = bytes;
    }
    *out = b->p;
    return cudaSuccess;
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    for (int i = 0; i < n; ++i) retired.emplace_back(bufs[i].dev, bufs[i].p);
    for (const auto &r : retired) {
      DeviceGuard guard(r.first);
      cudaFree(r.second);
    }
    retired.clear(), n = 0;
    cudaGetLastError(); // e.g. at process exit: not sticky
  }
};

// Shared memory beyond 48 KB a block (dynamic `smem` + the kernel's static `fixed`) needs the
// kernel's opt-in attribute (its dynamic part), per kernel and device. Set once per (kernel,
// device) at the largest size asked so far, not on every launch: the fast path is one atomic
// read; raising it takes a lock, so that two threads asking for different sizes cannot leave the
// attribute below what the cache says.
template <auto Kernel> cudaError_t smem_opt_in(size_t smem, size_t fixed, int device_id) {
  static std::atomic<int> set[kMaxDevices];
  static std::mutex raise;
  if (smem + fixed <= (48 << 10)) return cudaSuccess;
  if (device_id < 0 || device_id >= kMaxDevices)
    return cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if ((size_t)set[device_id].load(std::memory_order_acquire) >= smem) return cudaSuccess;
  std::lock_guard<std::mutex> lock(raise);
  if ((size_t)set[device_id].load(std::memory_order_relaxed) >= smem) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e == cudaSuccess) set[device_id].store((int)smem, std::memory_order_release);
  return e;
}

// Resident blocks a multiprocessor of Kernel at `threads` a block (a multiple of 32) and `smem`
// dynamic bytes: the grid of a grid-stride kernel is one wave. Asked once per (kernel, device,
// block size) and remembered with its smem; another smem asks again (and is remembered instead).
template <auto Kernel> int resident_blocks(int device, int threads, size_t smem) {
  static std::atomic<int64_t> cache[kMaxDevices][33]; // smem << 16 | blocks
  const int slot = threads / 32;
  const bool cached = device >= 0 && device < kMaxDevices && threads % 32 == 0 && slot <= 32;
  const int64_t c = cached ? cache[device][slot].load(std::memory_order_relaxed) : 0;
  if (c && (size_t)(c >> 16) == smem) return (int)(c & 0xffff);
  int v = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, Kernel, threads, smem) != cudaSuccess || v < 1) {
    cudaGetLastError();
    v = 1;
  }
  if (cached) cache[device][slot].store((int64_t)smem << 16 | v, std::memory_order_relaxed);
  return v;
}
// the clusters of cfg's shape (a kernel's fixed block, shared memory and cluster size) resident at
// once, asked once a kernel and device; 0 where none fits
template <auto Kernel> int resident_clusters(int device, const cudaLaunchConfig_t &cfg) {
  static std::atomic<int> cache[kMaxDevices]; // clusters, or -1: none fits
  const bool cached = device >= 0 && device < kMaxDevices;
  int v = cached ? cache[device].load(std::memory_order_relaxed) : 0;
  if (v) return v > 0 ? v : 0;
  if (cudaOccupancyMaxActiveClusters(&v, Kernel, &cfg) != cudaSuccess) cudaGetLastError(), v = 0;
  if (cached) cache[device].store(v > 0 ? v : -1, std::memory_order_relaxed);
  return v > 0 ? v : 0;
}

// ---------------------------------------------------------------------------------------------
// [dispatch] a compile-time variant from a runtime value
// ---------------------------------------------------------------------------------------------

template <typename T> struct type_tag { using type = T; };
template <int N> using int_c = std::integral_constant<int, N>;

// f(type_tag<T>) with T the element type of fusedk scalar s.
template <typename F> cudaError_t dispatch_scalar(int s, F &&f) {
  switch (s) {
    case FUSEDK_F32: return f(type_tag<float>());
    case FUSEDK_F16: return f(type_tag<__half>());
    case FUSEDK_BF16: return f(type_tag<__nv_bfloat16>());
  }
  return cudaErrorInvalidValue;
}

// f(int_c<n>) where n is one of Ns, else f(int_c<Default>).
template <int Default, int... Ns, typename F> cudaError_t dispatch_int(int n, F &&f) {
  cudaError_t e = cudaSuccess;
  if (!((n == Ns ? (e = f(int_c<Ns>()), true) : false) || ...)) e = f(int_c<Default>());
  return e;
}
// dispatch_int over a list kept as a type (its first value the default), and the list's values:
// a choice made at run time over the values and the dispatch read one list
template <int... Ns, typename F> cudaError_t dispatch_seq(std::integer_sequence<int, Ns...>, int n, F &&f) {
  return dispatch_int<Ns...>(n, f);
}
template <int... Ns> constexpr std::array<int, sizeof...(Ns)> int_values(std::integer_sequence<int, Ns...>) {
  return {Ns...};
}

// ---------------------------------------------------------------------------------------------
// [numerics] element types <-> float32; the activations
// ---------------------------------------------------------------------------------------------

template <typename T> __device__ __forceinline__ float to_f32(T v);
template <> __device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// v rounded to T and back: the rounding points of exact mode
template <typename T> __device__ __forceinline__ float round_to(float v) { return to_f32<T>(from_f32<T>(v)); }

// The activations of act, glu and silu_fma ([elementwise]) and of linear's epilogue passes ([linear]).
// The sigmoid forms, x * rcp(1 + e^-2z): 0.5 (1 + tanh(z)) = 1 / (1 + e^-2z) has no cancellation
// where tanh(z) nears -1 (a few float32 ulps everywhere), and costs an expf and a correctly
// rounded reciprocal instead of tanhf and a full divide, which make act compute-bound (~50
// instructions an element). 1 + e^-2z = inf gives
// x * 0 = -0 (the limit); x = +inf gives inf and x = -inf NaN, as the formula does in float64.
__device__ __forceinline__ float act_f32(float v, int kind) {
  switch (kind) {
    case FUSEDK_ACT_GELU: return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
    case FUSEDK_ACT_GELU_TANH: return v * __frcp_rn(1.f + expf(-1.5957691216057307f * fmaf(0.044715f * v, v * v, v)));
    case FUSEDK_ACT_SILU: return v * __frcp_rn(1.f + expf(-v));
    case FUSEDK_ACT_NONE: return v; // linear's identity
    default: return v > 0.f ? v : v == v ? 0.f : v; // relu; NaN stays NaN (fmaxf would drop it)
  }
}
// act_f32 for a result rounded to a 16-bit type (the conv's epilogue, group_norm's and
// channel_rmsnorm's outputs): SiLU as v rcp(1 + e^-v) on the approximate ex2 and rcp, 5
// instructions instead of ~20, which left those kernels issue-bound. __expf's error grows with |v|
// (about 2 + 1.2 |v| float32 ulps), still 20x below a 16-bit rounding. rcp.approx without ftz
// keeps act_f32's values where 1 + e^-v passes 2^126 (a divide's approximation gives 0 there) and
// its limits: e^-v = inf gives -0, v = -inf NaN.
__device__ __forceinline__ float act_16(float v, int kind) {
  if (kind != FUSEDK_ACT_SILU) return act_f32(v, kind);
  float r;
  asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(1.f + __expf(-v)));
  return v * r;
}
// act_16 where T is 16-bit, act_f32 where it is float32
template <typename T> __device__ __forceinline__ float act_t(float v, int kind) {
  return sizeof(T) == 2 ? act_16(v, kind) : act_f32(v, kind);
}
// f(integral_constant<int, act>) for the runtime act: a kernel's loop over many elements compiled
// once per activation (a switch an element spreads the loop over the instruction cache)
template <typename F> __device__ __forceinline__ void with_act(int act, F &&f) {
  switch (act) {
    case FUSEDK_ACT_GELU: f(std::integral_constant<int, FUSEDK_ACT_GELU>{}); break;
    case FUSEDK_ACT_GELU_TANH: f(std::integral_constant<int, FUSEDK_ACT_GELU_TANH>{}); break;
    case FUSEDK_ACT_SILU: f(std::integral_constant<int, FUSEDK_ACT_SILU>{}); break;
    case FUSEDK_ACT_RELU: f(std::integral_constant<int, FUSEDK_ACT_RELU>{}); break;
    default: f(std::integral_constant<int, FUSEDK_ACT_NONE>{}); break;
  }
}

// ---------------------------------------------------------------------------------------------
// [memory] 16-byte vectors, loads and stores named by cache policy, per-thread row walks
// ---------------------------------------------------------------------------------------------

// VEC elements of T as raw 32-bit words (one 16-bit element in the low half for the scalar
// path of 16-bit types): 16 bytes are four registers whatever T is, and a cached row costs
// exactly its size in registers (an array of 16-bit T would take a register per element).
template <typename T, int VEC> struct Raw { uint32_t w[(sizeof(T) * VEC + 3) / 4]; };

// One access: a single 128-bit load for 16 bytes; RO = through the read-only cache (weights and
// per-sample vectors, re-read by every row).
template <typename T, int VEC, bool RO = false> __device__ __forceinline__ Raw<T, VEC> ld(const T *p) {
  Raw<T, VEC> r;
  if constexpr (sizeof(T) * VEC == 16 || sizeof(T) * VEC == 32) { // 32: a float32 operand beside 16-bit rows
#pragma unroll
    for (int h = 0; h < (int)(sizeof(T) * VEC / 16); ++h) {
      const uint4 *q = reinterpret_cast<const uint4 *>(p) + h;
      const uint4 u = RO ? __ldg(q) : *q;
      r.w[4 * h] = u.x, r.w[4 * h + 1] = u.y, r.w[4 * h + 2] = u.z, r.w[4 * h + 3] = u.w;
    }
  } else if constexpr (sizeof(T) * VEC == 4) {
    const unsigned *q = reinterpret_cast<const unsigned *>(p);
    r.w[0] = RO ? __ldg(q) : *q;
  } else {
    static_assert(sizeof(T) * VEC == 2, "16- or 32-byte vectors or single elements");
    const unsigned short *q = reinterpret_cast<const unsigned short *>(p);
    r.w[0] = RO ? __ldg(q) : *q;
  }
  return r;
}

// Element i of a Raw as float: bf16 is the high half of a float (one shift or mask).
template <typename T, int VEC> __device__ __forceinline__ void to_floats(const Raw<T, VEC> &r, float (&out)[VEC]) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    if constexpr (sizeof(T) == 4) {
      out[i] = __uint_as_float(r.w[i]);
    } else {
      const uint32_t h = i & 1 ? r.w[i / 2] >> 16 : r.w[i / 2] & 0xffffu;
      if constexpr (std::is_same<T, __nv_bfloat16>::value) out[i] = __uint_as_float(h << 16);
      else out[i] = __half2float(__ushort_as_half((unsigned short)h));
    }
  }
}

template <typename T, int VEC, bool RO = false> __device__ __forceinline__ void load(const T *p, float (&out)[VEC]) {
  to_floats<T, VEC>(ld<T, VEC, RO>(p), out);
}

// two floats rounded into one 32-bit word of 16-bit values (one F2FP instruction)
template <typename T> __device__ __forceinline__ uint32_t pack2(float a, float b);
template <> __device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t *>(&h);
}
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t *>(&h);
}

// v rounded to T element by element: 16-bit pairs through one packing conversion (F2FP, two
// values an instruction, where a single value takes F2F) and back.
template <typename T, int VEC> __device__ __forceinline__ void round_all(float (&v)[VEC]) {
  if constexpr (sizeof(T) == 2 && VEC % 2 == 0) {
    Raw<T, VEC> r;
#pragma unroll
    for (int i = 0; i < VEC; i += 2) r.w[i / 2] = pack2<T>(v[i], v[i + 1]);
    to_floats<T, VEC>(r, v);
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[i] = round_to<T>(v[i]);
  }
}

// One 16-byte streaming store (st.global.cs.v4). NVVM splits a plain vector store into four
// 32-bit ones here (four instructions, partial sectors). Unlike __stcs this asm has no memory
// clobber, so it does not order later loads behind it: each element's own load feeds its own
// store, which keeps in-place calls correct.
__device__ __forceinline__ void st_cs(void *p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d));
}

// Streaming store of VEC floats as T: 16 bytes as one st.global.cs (evict-first: outputs are not
// re-read by this kernel); single elements as plain stores.
template <typename T, int VEC> __device__ __forceinline__ void store_cs(T *p, const float (&in)[VEC]) {
  if constexpr (sizeof(T) == 2 && VEC == 8) {
    st_cs(p, pack2<T>(in[0], in[1]), pack2<T>(in[2], in[3]), pack2<T>(in[4], in[5]), pack2<T>(in[6], in[7]));
  } else if constexpr (sizeof(T) == 4 && VEC == 4) {
    st_cs(p, __float_as_uint(in[0]), __float_as_uint(in[1]), __float_as_uint(in[2]), __float_as_uint(in[3]));
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) p[i] = from_f32<T>(in[i]);
  }
}

template <typename T> __device__ __forceinline__ T *at(const fusedk__rows &r, int64_t b, int64_t l) {
  return static_cast<T *>(r.p) + b * r.sb + l * r.sl;
}

inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
inline size_t pad256(size_t b) { return (b + 255) & ~(size_t)255; }

// Hopper bulk copies (cp.async.bulk, the TMA engine without a tensor map): one thread moves a
// contiguous run of bytes global -> shared and an mbarrier counts them in. The data in flight
// costs no registers, so a block can keep tens of KB of loads outstanding. sm_90+ only: the
// kernels using them check the device code they got (tma_code) before they are launched.
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FUSEDK__SM90 1
__device__ __forceinline__ void mbar_init(uint64_t *bar, int arrivals) { // arrivals a phase
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
}
__device__ __forceinline__ void fence_mbar_init() { // the copy engine (async proxy) sees the init
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// The barrier's phase completes when the issuing thread has arrived, expecting `bytes`, and
// that many have landed through bulk_copy (dst and src 16-byte aligned, bytes a multiple of 16).
__device__ __forceinline__ void mbar_expect(uint64_t *bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
  } while (!done);
}
#endif


// Whether the device runs Kernel from sm_90+ code (the bulk copies exist there; an sm_80-only
// build, or a later GPU JIT-compiling the compute_80 PTX, gets the empty body). Once per device.
template <auto Kernel> bool tma_code(int device) {
  static std::atomic<int> cache[kMaxDevices]; // 0 unknown, 1 yes, 2 no
  const bool cached = device >= 0 && device < kMaxDevices;
  int v = cached ? cache[device].load(std::memory_order_relaxed) : 0;
  if (v == 0) {
    cudaFuncAttributes fa;
    v = cudaFuncGetAttributes(&fa, Kernel) == cudaSuccess && fa.ptxVersion >= 90 && fa.binaryVersion >= 90 ? 1 : 2;
    cudaGetLastError();
    if (cached) cache[device].store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

// whether environment variable `name` is set to `value` (the bench's switches between forms)
inline bool env_is(const char *name, const char *value) {
  const char *e = getenv(name);
  return e && strcmp(e, value) == 0;
}
// environment variable `name` as a positive number, else `fallback` (the bench's and tests' forced choices)
inline long long env_int(const char *name, long long fallback) {
  const char *e = getenv(name);
  const long long v = e ? atoll(e) : 0;
  return v > 0 ? v : fallback;
}

// FUSEDK_NO_TMA=1 in the environment: the pre-Hopper kernels everywhere (A/B and their tests).
bool tma_disabled() {
  static const bool off = [] {
    const char *e = getenv("FUSEDK_NO_TMA");
    return e && *e && strcmp(e, "0") != 0;
  }();
  return off;
}

template <int NV, typename F> __device__ __forceinline__ void for_each_vec(int64_t nvec, int G, F &&f) {
  const int t = threadIdx.x;
  if constexpr (NV > 0) {
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int j = t + k * G; // < 16 * 1024: cached rows are short (a 32-bit test)
      if (j < (int)nvec) f(k, (int64_t)j);
    }
  } else {
    for (int64_t j = t; j < nvec; j += G) f(0, j);
  }
}

// An empty asm on the cached words: the compiler may no longer convert them early or reuse
// floats converted in an earlier pass, so only the packed words stay live.
template <typename T, int VEC> __device__ __forceinline__ Raw<T, VEC> opaque(Raw<T, VEC> r) {
#pragma unroll
  for (int i = 0; i < (int)(sizeof(r) / 4); ++i) asm volatile("" : "+r"(r.w[i]));
  return r;
}

// VEC bytes of e4m3 (the FP8 side of quantize_fp8, dequantize_fp8 and the norms' _fp8 forms):
// one 8- or 4-byte access, or one byte
template <int VEC> struct Bytes { alignas(VEC) uint8_t b[VEC]; };
template <int VEC> __device__ __forceinline__ Bytes<VEC> ld_bytes(const uint8_t *p) {
  Bytes<VEC> r;
  if constexpr (VEC == 8) *reinterpret_cast<uint2 *>(r.b) = *reinterpret_cast<const uint2 *>(p);
  else if constexpr (VEC == 4) *reinterpret_cast<uint32_t *>(r.b) = *reinterpret_cast<const uint32_t *>(p);
  else r.b[0] = *p;
  return r;
}
template <int VEC> __device__ __forceinline__ void st_bytes(uint8_t *p, const Bytes<VEC> &r) {
  if constexpr (VEC == 8) *reinterpret_cast<uint2 *>(p) = *reinterpret_cast<const uint2 *>(r.b);
  else if constexpr (VEC == 4) *reinterpret_cast<uint32_t *>(p) = *reinterpret_cast<const uint32_t *>(r.b);
  else *p = r.b[0];
}
// e4m3 conversions: cvt.rn.satfinite (NaN to 0x7f), two values an instruction, of v * inv (one
// float32 product each, as the CPU reference); e4m3 to f16 is exact
template <int VEC> __device__ __forceinline__ Bytes<VEC> e4m3_of(const float (&v)[VEC], float inv) {
  Bytes<VEC> o;
  auto two = [&](int i) -> uint32_t {
    return __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(v[i], inv), __fmul_rn(v[i + 1], inv)), __NV_SATFINITE,
                                    __NV_E4M3);
  };
  if constexpr (VEC % 4 == 0) { // whole words (one byte permute a word, not a byte at a time)
#pragma unroll
    for (int i = 0; i < VEC; i += 4) reinterpret_cast<uint32_t *>(o.b)[i / 4] = two(i) | two(i + 2) << 16;
  } else if constexpr (VEC % 2 == 0) {
#pragma unroll
    for (int i = 0; i < VEC; i += 2) reinterpret_cast<uint16_t *>(o.b)[i / 2] = (uint16_t)two(i);
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) o.b[i] = __nv_cvt_float_to_fp8(__fmul_rn(v[i], inv), __NV_SATFINITE, __NV_E4M3);
  }
  return o;
}
__device__ __forceinline__ float f32_of_e4m3(uint8_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
}

// ---------------------------------------------------------------------------------------------
// [reduce] warp and row-group sums
// ---------------------------------------------------------------------------------------------

// Butterfly sum over aligned groups of `width` lanes (a power of two <= 32): every lane of a
// group gets its group's sum. Unrolled; the steps beyond the width are skipped uniformly, and a
// whole warp (the common width) runs its five steps without a test each.
template <typename F> __device__ __forceinline__ F lanes_sum(F v, int width) {
  static_assert(std::is_floating_point<F>::value, "sums of float or double");
  if (width == 32) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2)
    if (o < width) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The 8-bit rows' quantization (int8: attention_int8, qk_norm_rope_int8; e4m3: quantize_fp8, the
// norms' _fp8 forms; fusedk.h's fusedk__amax, fusedk__q_inv): the largest magnitude, a NaN winning
// (the canonical NaN, whose bits order above every magnitude's, so a max over the bits as
// unsigned agrees), and QMAX / amax where finite (and amax > 0), else 0
__device__ __forceinline__ float amax_nan(float m, float x) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(fabsf(x)));
  return r;
}
__device__ __forceinline__ float q_inv(float qmax, float amax) {
  const float r = __fdiv_rn(qmax, amax);
  return amax > 0.f && r < INFINITY ? r : 0.f;
}
template <int QMAX> __device__ __forceinline__ float q_inv(float amax) { return q_inv((float)QMAX, amax); }
// x * inv rounded to nearest even within [lo, 127]: q and k of attention_int8 (lo -127), and
// quantize_int8's weights (lo -128: torchao's symmetric int8)
__device__ __forceinline__ int i8_of(float x, float inv, int lo = -127) {
  return max(lo, min(127, __float2int_rn(x * inv)));
}
// VEC bytes of a quantized row: e4m3, or quantize_int8's int8
template <int VEC> __device__ __forceinline__ Bytes<VEC> q8_of(const float (&v)[VEC], float inv, bool i8) {
  if (!i8) return e4m3_of<VEC>(v, inv);
  Bytes<VEC> o;
#pragma unroll
  for (int i = 0; i < VEC; ++i) o.b[i] = (uint8_t)i8_of(v[i], inv, -128);
  return o;
}
// a quantized row's qmax: its data x * (qmax / amax), its scale amax / qmax
__device__ __forceinline__ float q8_max(bool i8) { return i8 ? 127.5f : 448.f; }
// the row's inverse step: e4m3's 448 / amax; int8's 1 / (amax / 127.5), the reciprocal of its
// float32 scale, as torchao rounds it (its int8 data then the same bits)
__device__ __forceinline__ float q8_inv(float amax, bool i8) {
  return i8 ? q_inv(1.f, __fdiv_rn(amax, 127.5f)) : q_inv(448.f, amax);
}
// amax_nan over aligned groups of `width` lanes (a power of two <= 32), as lanes_sum
__device__ __forceinline__ float lanes_amax(float v, int width) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2)
    if (o < width) v = amax_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// N sums over the G threads of a row group, each thread getting all N. G <= 32: shuffles inside
// the aligned lane group; G > 32 (a multiple of 32, one group per block row): warp sums, one
// shared-memory slot per warp and sum (smem[k]), one barrier for all N, then each warp sums the
// slots by a whole-warp butterfly, lanes past the slots adding zeros (exact: the same bits as a
// butterfly over the slots alone; no test a step, fewer instructions than a butterfly of the
// slots' width). Every lane
// gets bitwise the same sums (a butterfly of commutative adds), so what a row decides from them
// is uniform over its group.
template <int N> __device__ __forceinline__ void group_sums(float (&v)[N], int G, float (*smem)[32]) {
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = lanes_sum(v[k], G < 32 ? G : 32);
  if (G <= 32) return;
  const int warps = G / 32, lane = threadIdx.x & 31, base = threadIdx.y * warps;
  if (lane == 0)
#pragma unroll
    for (int k = 0; k < N; ++k) smem[k][base + threadIdx.x / 32] = v[k];
  __syncthreads();
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = lanes_sum(lane < warps ? smem[k][base + lane] : 0.f, 32);
}

// The row group's amax_nan (group_sums' shape, one value): shuffles, then a shared slot a warp.
// The first barrier keeps the slots of a reduction before it until every warp has read them.
__device__ __forceinline__ float group_amax(float v, int G, float (*smem)[32]) {
  v = lanes_amax(v, G < 32 ? G : 32);
  if (G <= 32) return v;
  const int warps = G / 32, lane = threadIdx.x & 31, base = threadIdx.y * warps;
  __syncthreads();
  if (lane == 0) smem[0][base + threadIdx.x / 32] = v;
  __syncthreads();
  return lanes_amax(lane < warps ? smem[0][base + lane] : 0.f, 32);
}

// ---------------------------------------------------------------------------------------------
// [tile] the tensor-core layer: tiles of matrices in shared memory and the warp-level matrix
// instructions over them (sm_80+: cp.async, ldmatrix, mma.sync).
//
// A tile row is a run of 16-byte chunks (8 elements). Chunk c of row r lives at chunk
// c ^ (r & 7): ldmatrix reads 8 rows of one chunk column at once, and with rows 128 bytes or
// longer an unswizzled column sits in one bank group (8-way conflict); XOR-ing by the row's low
// bits spreads the 8 rows over all 32 banks, for loads by row (cp.async) and by column alike.
// ---------------------------------------------------------------------------------------------

// byte offset of chunk `c` of row `r` in a swizzled tile of `CH` chunks a row. Rows shorter than
// the 8 chunks of a bank cycle (CH 1, 2, 4: a low-rank tile's [k, r] rows) share a 128-byte line
// with the next 8 / CH rows, and the XOR takes the line's index instead (1 chunk: 8 rows of one
// column are one line already).
template <int CH> __device__ __forceinline__ uint32_t swz(int r, int c) {
  static_assert(CH > 0 && (CH & (CH - 1)) == 0, "chunks a row: a power of two");
  if constexpr (CH >= 8) return (uint32_t)(r * CH + (c ^ (r & 7))) * 16u;
  else return (uint32_t)(r * CH + (c ^ ((r * CH / 8) & (CH - 1)))) * 16u;
}

// 16 bytes global -> shared without a register stop; `bytes` 0 fills zeros (rows past a
// tensor's end) and reads nothing. .cg: the data streams past L1 (each tile is read once a block).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// waits until at most N of this thread's committed groups are in flight
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Four 8x8 matrices of 16-bit values, lane l giving the address of row l % 8 of matrix l / 8;
// each lane receives, per matrix, the two values of row l / 4 at columns 2 (l % 4) and + 1: the
// fragment layout of mma's operands. .trans delivers the transposed matrices (row-major B).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// ---- the warp-level MMA layer: a warp's tile += A B from swizzled shared-memory tiles ----
// One k step of a warp's product is 32 bytes of k (16 16-bit elements; 32 8-bit ones), so the
// fragments' lane addressing below is the same for every element type: a type adds an MmaOp.

// MmaOp<T>: c[16x8] += a[16 x kK] b[kK x 8] for element type T, float32 accumulators. Lane l
// holds c at rows l / 4 (c0, c1) and l / 4 + 8 (c2, c3), columns 2 (l % 4) and + 1; a as four
// 8x8 blocks of 32-bit words (rows 0-7 / 8-15 by the k step's halves: a0 a1 a2 a3 = top-left,
// bottom-left, top-right, bottom-right); b as two (the k step's halves). The accumulator of two
// n8 tiles is, packed to T, the a operand of the next product (flash attention's P, a low-rank
// update's h never leave registers: pack_a). f16 and bf16 only: an 8-bit type's m16n8k32 reads
// the same fragments, but has no transposing ldmatrix (kAt, kBt take a transposed copy first).
template <typename T> struct MmaOp {
  static_assert(sizeof(T) == 0, "MmaOp: no tensor-core instruction for this element type");
};
template <> struct MmaOp<__half> {
  static constexpr int kK = 16;
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct MmaOp<__nv_bfloat16> {
  static constexpr int kK = 16;
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// How an operand tile sits in shared memory, and so which ldmatrix gives its fragments:
//   kA  A [m, k] (rows m)                      kAt A stored [k, m] (ldmatrix .trans)
//   kB  B stored [n, k] (K-major: K, a's rows)  kBt B stored [k, n] (N-major: V, u_t; .trans)
// A fragment is one ldmatrix.x4: for A a 16-row tile's k step, for B two n8 tiles' (16 n).
enum MmaRole { kA, kAt, kB, kBt };

// One lane's ldmatrix addresses in a swizzled tile of CH chunks a row: fragment (i, k) = row tile
// or n pair i, k step k. The lane's row within a 16-row step and its chunk parity follow the
// role; a fragment's row is lane_row + 16 (k for the transposed roles, i otherwise), its chunk
// 2 (i or k) + parity. The swizzle's XOR depends on the row's low bits only, which 16-row steps
// keep, so four per-lane offsets and immediates address every fragment (naive addresses hold a
// register per (i, k) across a loop). Indexes known only at run time (a warp's rows, a share's
// k steps) go into the operand once, through i_from and k_from; fragments index from there.
template <int CH, int ROLE> struct WarpOperand {
  static constexpr bool kTrans = ROLE == kAt || ROLE == kBt;
  static constexpr int kX = CH >= 8 ? 4 : CH / 2; // chunk pairs with their own offset
  uint32_t row, x[kX];
  int b, flip; // the lane's chunk parity; swz<CH>'s XOR for its rows
  __device__ __forceinline__ WarpOperand(uint32_t base, int lane) {
    const int r = ROLE == kA    ? (lane & 15)
                  : ROLE == kBt ? (lane & 7) + ((lane >> 3) & 1) * 8
                                : (lane & 7) + (lane >> 4) * 8;
    b = ROLE == kA || ROLE == kBt ? lane >> 4 : (lane >> 3) & 1;
    flip = CH >= 8 ? (r & 7) : ((r * CH / 8) & (CH - 1));
    row = base + (uint32_t)r * CH * 16;
    pairs(0);
  }
  // chunk pairs counted from p0: x[q] the offset of pair p0 + q (pairs 4 on: 8 chunks further)
  __device__ __forceinline__ void pairs(int p0) {
#pragma unroll
    for (int q = 0; q < kX; ++q) x[q] = (uint32_t)((2 * (p0 + q) + b) ^ flip) * 16u;
  }
  __device__ __forceinline__ WarpOperand from(int steps, int pair0) const {
    WarpOperand o = *this;
    o.row += (uint32_t)steps * 16 * CH * 16;
    o.pairs(pair0);
    return o;
  }
  // the operand with fragment index i (k) counted from i0 (k0)
  __device__ __forceinline__ WarpOperand i_from(int i0) const { return kTrans ? from(0, i0) : from(i0, 0); }
  __device__ __forceinline__ WarpOperand k_from(int k0) const { return kTrans ? from(k0, 0) : from(0, k0); }
  __device__ __forceinline__ uint32_t at(int i, int k) const {
    const int step = kTrans ? k : i, pair = kTrans ? i : k;
    return row + (step * 16 * CH + (pair / 4) * 8) * 16 + x[pair % kX];
  }
  __device__ __forceinline__ void frag(uint32_t (&r)[4], int i, int k) const {
    if constexpr (kTrans) ldmatrix_x4_trans(r, at(i, k));
    else ldmatrix_x4(r, at(i, k));
  }
};

// An A operand already in registers (pack_a's output): fragment (i, k) = a[i][k], or a[k] for
// a warp's single row tile
template <typename Arr> struct RegOperand {
  const Arr &a;
  __device__ __forceinline__ void frag(uint32_t (&r)[4], int i, int k) const {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (std::rank<Arr>::value == 3) r[e] = a[i][k][e];
      else r[e] = a[k][e];
    }
  }
};
template <typename Arr> __device__ __forceinline__ RegOperand<Arr> in_regs(const Arr &a) { return {a}; }

// The warp's MT 16-row tiles x 2 NP n8 tiles (acc(i, t): float[4]) += A B over KS k steps
// 0, KSTRIDE, ... (KSTRIDE: warps sharing a tile's k steps; their first: k_from). Each B
// fragment serves all MT row tiles (shared-memory reads a flop fall as 1 / MT). PF: step q + 1's
// fragments load before step q's products (two sets of registers: the products don't wait on
// the loads); else A's at each step's start and each B fragment just before its products.
template <typename T, int MT, int NP, int KS, int KSTRIDE = 1, bool PF = false, typename Acc, typename A,
          typename B>
__device__ __forceinline__ void warp_mma(Acc &&acc, const A &a, const B &b) {
  constexpr int NB = PF ? 2 : 1; // fragment sets
  uint32_t fa[NB][MT][4], fb[NB][NP][4];
  auto load = [&](int q) {
#pragma unroll
    for (int i = 0; i < MT; ++i) a.frag(fa[q % NB][i], i, q * KSTRIDE);
#pragma unroll
    for (int n = 0; n < NP; ++n) b.frag(fb[q % NB][n], n, q * KSTRIDE);
  };
  if (PF) load(0);
#pragma unroll
  for (int q = 0; q < KS; ++q) {
    if (PF && q + 1 < KS) load(q + 1);
    if (!PF)
#pragma unroll
      for (int i = 0; i < MT; ++i) a.frag(fa[0][i], i, q * KSTRIDE);
#pragma unroll
    for (int n = 0; n < NP; ++n) {
      if (!PF) b.frag(fb[0][n], n, q * KSTRIDE);
      const uint32_t(&f)[4] = fb[q % NB][n];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        MmaOp<T>::run(acc(i, 2 * n), fa[q % NB][i], f[0], f[1]);
        MmaOp<T>::run(acc(i, 2 * n + 1), fa[q % NB][i], f[2], f[3]);
      }
    }
  }
}

// An accumulator of N columns as the next product's a operand (attention's P, a low-rank
// update's h): the pairs of n8 tiles 2k, 2k + 1 rounded to T, k step k of 16 columns
template <typename T, int N> __device__ __forceinline__ void pack_a(uint32_t (&a)[N / 16][4], const float (&c)[N / 8][4]) {
#pragma unroll
  for (int k = 0; k < N / 16; ++k) {
    const float(&x)[4] = c[2 * k], (&y)[4] = c[2 * k + 1];
    a[k][0] = pack2<T>(x[0], x[1]), a[k][1] = pack2<T>(x[2], x[3]), a[k][2] = pack2<T>(y[0], y[1]),
    a[k][3] = pack2<T>(y[2], y[3]);
  }
}

// 8 16-bit values as one 16-byte shared-memory store (a tile chunk the element loads filled)
__device__ __forceinline__ void sts_chunk(uint32_t dst, const uint16_t (&e)[8]) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(e[0] | (uint32_t)e[1] << 16),
               "r"(e[2] | (uint32_t)e[3] << 16), "r"(e[4] | (uint32_t)e[5] << 16), "r"(e[6] | (uint32_t)e[7] << 16)
               : "memory");
}

// Rows [0, R) of a [R, CH * 8] tile from global rows `src + r * stride` (element stride), by
// all `THREADS` threads, chunk by chunk. Rows r >= `valid` and chunks past `cols` elements fill
// zeros. VEC: rows 16-byte aligned and cols a multiple of 8, one cp.async a chunk (completing
// on the caller's commit/wait); else element loads and a 16-byte shared store (unaligned views,
// head sizes not a multiple of 8), visible after the caller's barrier.
template <typename T, int R, int CH, int THREADS, bool VEC>
__device__ __forceinline__ void load_tile(uint32_t dst, const T *src, int64_t stride, int valid, int cols) {
#pragma unroll
  for (int k = 0; k < (R * CH + THREADS - 1) / THREADS; ++k) {
    const int i = k * THREADS + (int)threadIdx.x, r = i / CH, c = i % CH;
    if ((R * CH) % THREADS && i >= R * CH) break;
    const T *p = src + (int64_t)r * stride + c * 8;
    if constexpr (VEC) {
      const bool in = r < valid && c * 8 < cols;
      cp_async16(dst + swz<CH>(r, c), in ? p : src, in ? 16 : 0);
    } else {
      uint16_t e[8];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        e[j] = r < valid && c * 8 + j < cols ? reinterpret_cast<const uint16_t *>(p)[j] : (uint16_t)0;
      sts_chunk(dst + swz<CH>(r, c), e);
    }
  }
}

// A ring of ST shared-memory stages over tiles [0, n), filled by cp.async: load(t, stage) issues
// tile t's copies; tile t is computed (compute(t, stage)) once it has landed, with the ST - 1
// tiles after it in flight. One barrier a tile: it makes tile t visible and frees tile t - 1's
// stage, which the load issued right after it refills. (The portable attention's K and V tiles,
// which alternate, keep their own two-buffer schedule: written as a ring of tiles of two kinds,
// its loop's tile offsets leave the uniform datapath for every thread's registers.)
template <int ST, typename Load, typename Compute>
__device__ __forceinline__ void ring_run(int n, Load &&load, Compute &&compute) {
  for (int t = 0; t < ST - 1; ++t) {
    if (t < n) load(t, t);
    cp_async_commit();
  }
  for (int t = 0; t < n; ++t) {
    cp_async_wait<ST - 2>(); // tile t landed (this thread's copies)
    __syncthreads();         // everyone's, and everyone is done with tile t - 1
    if (t + ST - 1 < n) load(t + ST - 1, (t + ST - 1) % ST);
    cp_async_commit();
    compute(t, t % ST);
  }
  cp_async_wait<0>();
  __syncthreads(); // the stages are free for whatever comes next
}

// ---- [tile], Hopper (sm_90a): TMA tensor maps, wgmma, warpgroup register reallocation ----
// A 16-bit operand tile lives in shared memory as column blocks of 64 elements (128 bytes, the
// 128-byte swizzle's span): block c holds columns [64 c, 64 c + 64) of every row, row r at
// r * 128 bytes, 16-byte chunk k of the row at k ^ (r & 7) (the hardware's Swizzle<3,4,3>,
// which TMA writes and wgmma reads). Blocks start 1024-byte aligned (8 rows: one swizzle atom).

// byte offset of chunk c of row r in such a tile of `rows` rows (the swizzle TMA writes)
__device__ __forceinline__ uint32_t swz128(int rows, int r, int c) {
  return (uint32_t)(c / 8) * rows * 128 + swz<8>(r, c % 8);
}

// The driver's cuTensorMapEncodeTiled through cudart, looked up once: nothing links libcuda.
PFN_cuTensorMapEncodeTiled_v12000 tmap_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void *p = nullptr;
    cudaDriverEntryPointQueryResult q;
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
#else
    const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) cudaGetLastError(), p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A tensor map over an R-dim tensor of `type` (dims innermost first, the inner one contiguous;
// byte strides of dims 1 .. R-1) that loads boxes of box[0] x .. x box[R-1] elements in the
// 128-byte swizzle; elements past the tensor's ends (negative coordinates too) load as zeros.
// False when TMA cannot describe it (base not 16-byte aligned, a stride not a multiple of 16 bytes).
template <int R>
bool tmap_nd(CUtensorMap *m, const void *p, CUtensorMapDataType type, const int64_t (&dm)[R],
             const int64_t (&st)[R - 1], const int (&bx)[R], CUtensorMapSwizzle swz = CU_TENSOR_MAP_SWIZZLE_128B) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tmap_encoder();
  if (!encode || !aligned16(p)) return false;
  cuuint64_t dims[R], strides[R - 1];
  cuuint32_t box[R], one[R];
  for (int i = 0; i < R; ++i) {
    if (dm[i] < 1 || dm[i] > ((int64_t)1 << 32)) return false;
    dims[i] = (cuuint64_t)dm[i], box[i] = (cuuint32_t)bx[i], one[i] = 1;
  }
  for (int i = 0; i < R - 1; ++i) { // a dim of one is never stepped: any valid stride describes it
    const int64_t b = dm[i + 1] == 1 ? 16 : st[i];
    if (b <= 0 || b % 16 || b >= ((int64_t)1 << 40)) return false;
    strides[i] = (cuuint64_t)b;
  }
  return encode(m, type, R, const_cast<void *>(p), dims, strides, box, one, CU_TENSOR_MAP_INTERLEAVE_NONE, swz,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
bool tmap_4d(CUtensorMap *m, const void *p, CUtensorMapDataType type, const int64_t (&dm)[4], const int64_t (&st)[3],
             int box0, int box1, CUtensorMapSwizzle swz = CU_TENSOR_MAP_SWIZZLE_128B) {
  const int bx[4] = {box0, box1, 1, 1};
  return tmap_nd<4>(m, p, type, dm, st, bx, swz);
}

// tmap_4d over a [B, S, H, D] tensor of 16-bit elements (element strides sb, ss, sh), boxes of
// `rows` x 64 elements at (d, s, h, b)
bool tmap_bshd(CUtensorMap *m, const void *p, bool bf16, int64_t B, int64_t S, int64_t H, int64_t D, int64_t sb,
               int64_t ss, int64_t sh, int rows) {
  const int64_t dm[4] = {D, S, H, B}, st[3] = {ss * 2, sh * 2, sb * 2};
  return tmap_4d(m, p, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, dm, st, 64, rows);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FUSEDK__SM90A 1
// one TMA box of `m` at coordinates (c0 .. c3) into shared memory, counted in by `bar`
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap *m, int c0, int c1, int c2, int c3,
                                            uint64_t *bar) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
               "%4, %5}], [%6];" ::"r"(dst), "l"(m), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar))
               : "memory");
}
// the 5-dim form (conv's [N, T, H, W, C] and [Co, kt, kh, kw, Ci] boxes)
__device__ __forceinline__ void tma_load_5d(uint32_t dst, const CUtensorMap *m, int c0, int c1, int c2, int c3, int c4,
                                            uint64_t *bar) {
  asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
               "%4, %5, %6}], [%7];" ::"r"(dst), "l"(m), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4),
               "r"(smem_u32(bar))
               : "memory");
}
// tma_load_5d into the same shared offset of every block of the cluster in `mask`, each block's
// barrier at `bar`'s offset counting the bytes in
__device__ __forceinline__ void tma_load_5d_mc(uint32_t dst, const CUtensorMap *m, int c0, int c1, int c2, int c3,
                                               int c4, uint64_t *bar, uint16_t mask) {
  asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%2, %3, %4, %5, %6}], [%7], %8;" ::"r"(dst), "l"(m), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
               "r"(c4), "r"(smem_u32(bar)), "h"(mask)
               : "memory");
}
// an arrival on the barrier at `bar`'s offset in cluster block `cta`
__device__ __forceinline__ void mbar_arrive_cta(uint64_t *bar, uint32_t cta) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_u32(bar)), "r"(cta));
  // release at the block's scope, as a consumer's arrival needs (its stage reads are wgmma's, done
  // by wgmma_wait): .release.cluster costs a MEMBAR.ALL.GPU an arrival
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(r) : "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// every thread of every block of the cluster; barrier inits made visible to the cluster first
__device__ __forceinline__ void cluster_sync_inits() {
  asm volatile("fence.mbarrier_init.release.cluster;\n"
               "barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// shared-memory writes by threads, made visible to the async proxy (wgmma's and TMA's reads)
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// a barrier over `n` threads (a warpgroup: 128; two taking turns: 256) with its own id, leaving
// the block's other warps
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }
// the warpgroup's register budget a thread, raised or lowered together (the producer gives its
// registers to the consumers)
template <int N> __device__ __forceinline__ void regs_raise() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N)); }
template <int N> __device__ __forceinline__ void regs_lower() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N)); }

// wgmma: a warpgroup's 64 x N x 16 product, issued asynchronously; fence before the first of a
// batch (the accumulators were written by ordinary instructions), commit the batch, wait for it.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Pins a wgmma's register operands at this point of the program: after a wait, no read of the
// accumulators moves above it; before a fence, no write of them (or of the a fragments: a copy,
// a zeroing) sinks below it into the batch, where ptxas would serialize the products for it.
template <int R> __device__ __forceinline__ void wgmma_hold(float (&d)[R][4]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(d[i][j])::"memory");
}
template <int R> __device__ __forceinline__ void wgmma_hold(uint32_t (&d)[R][4]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(d[i][j])::"memory");
}
template <int R> __device__ __forceinline__ void wgmma_hold(int (&d)[R][4]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(d[i][j])::"memory");
}
// The descriptor of a 128-byte-swizzled operand at shared address `addr` (swz 2: 64-byte rows,
// 64-byte swizzle). K-major (rows of K, Q and K tiles): sbo = 8 rows' bytes, the step between
// 8-row groups; lbo unused. MN-major (V as B, transposed): lbo = the step between 64-column
// blocks, sbo = 1024 between 8-row (k) groups.
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo, uint64_t swz = 1) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(sbo >> 4) << 32 | swz << 62;
}

// The wgmma wrappers' operand lists: the accumulator's N / 2 registers a thread as asm operands,
// k their constraint ("+f" read and written; "=f" written: the first product of a batch), d[t]
// holding n8 tile t (FUSEDK__WG_C); and their placeholders in the instruction (FUSEDK__WG_D of
// FUSEDK__WG_P). Each width's lists extend the next narrower width's.
#define FUSEDK__WG_R(k, t) k(d[t][0]), k(d[t][1]), k(d[t][2]), k(d[t][3])
#define FUSEDK__WG_C16(k) FUSEDK__WG_R(k, 0), FUSEDK__WG_R(k, 1)
#define FUSEDK__WG_C64(k) \
  FUSEDK__WG_C16(k), FUSEDK__WG_R(k, 2), FUSEDK__WG_R(k, 3), \
  FUSEDK__WG_R(k, 4), FUSEDK__WG_R(k, 5), FUSEDK__WG_R(k, 6), FUSEDK__WG_R(k, 7)
#define FUSEDK__WG_C80(k) FUSEDK__WG_C64(k), FUSEDK__WG_R(k, 8), FUSEDK__WG_R(k, 9)
#define FUSEDK__WG_C96(k) FUSEDK__WG_C80(k), FUSEDK__WG_R(k, 10), FUSEDK__WG_R(k, 11)
#define FUSEDK__WG_C128(k) \
  FUSEDK__WG_C96(k), FUSEDK__WG_R(k, 12), FUSEDK__WG_R(k, 13), FUSEDK__WG_R(k, 14), FUSEDK__WG_R(k, 15)
#define FUSEDK__WG_C160(k) \
  FUSEDK__WG_C128(k), FUSEDK__WG_R(k, 16), FUSEDK__WG_R(k, 17), FUSEDK__WG_R(k, 18), FUSEDK__WG_R(k, 19)
#define FUSEDK__WG_C192(k) \
  FUSEDK__WG_C160(k), FUSEDK__WG_R(k, 20), FUSEDK__WG_R(k, 21), FUSEDK__WG_R(k, 22), FUSEDK__WG_R(k, 23)
#define FUSEDK__WG_C256(k) \
  FUSEDK__WG_C192(k), \
  FUSEDK__WG_R(k, 24), FUSEDK__WG_R(k, 25), FUSEDK__WG_R(k, 26), FUSEDK__WG_R(k, 27), \
  FUSEDK__WG_R(k, 28), FUSEDK__WG_R(k, 29), FUSEDK__WG_R(k, 30), FUSEDK__WG_R(k, 31)
#define FUSEDK__WG_P16 "%0, %1, %2, %3, %4, %5, %6, %7"
#define FUSEDK__WG_P64 \
  FUSEDK__WG_P16 ", %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FUSEDK__WG_P80 FUSEDK__WG_P64 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define FUSEDK__WG_P96 FUSEDK__WG_P80 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define FUSEDK__WG_P128 \
  FUSEDK__WG_P96 ", %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FUSEDK__WG_P160 \
  FUSEDK__WG_P128 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define FUSEDK__WG_P192 \
  FUSEDK__WG_P160 ", %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define FUSEDK__WG_P256 \
  FUSEDK__WG_P192 ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define FUSEDK__WG_D(N) "{" FUSEDK__WG_P##N "}"
// a wrapper's asm for T: the bf16 or the f16 instruction (bf: T is bfloat16)
#define FUSEDK__WG_TYPED(M, ...) \
  if constexpr (bf) M(__VA_ARGS__, bf16); \
  else M(__VA_ARGS__, f16);

// d[64 x N] (+)= a[64 x 16] b[16 x N] (acc 0: =). SS: a and b K-major in shared memory. RS: a in
// registers (the m16n8k16 a-fragment layout of mma.sync, per warp of the group), b N-major
// ("transposed", tnspB = 1: rows of b contiguous along N, as V's [key, d] rows are). The
// accumulator's layout per warp w of the group (rows 16 w + [0, 16)) is mma.sync's m16n8 one:
// n8 tile t of the row block in d[t].
#define FUSEDK__WGMMA_SS(N, IA, IB, IACC, TY)                                                              \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IACC ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N     \
               "k16.f32." #TY "." #TY " " FUSEDK__WG_D(N) ", %" #IA ", %" #IB ", p, 1, 1, 0, 0;\n}"       \
               : FUSEDK__WG_C##N("+f")                                                                      \
               : "l"(a), "l"(b), "r"(acc))
#define FUSEDK__WGMMA_SS0(N, IA, IB, TY)                                                                    \
  asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #TY "." #TY " " FUSEDK__WG_D(N) ", %" #IA     \
               ", %" #IB ", 0, 1, 1, 0, 0;"                                                                 \
               : FUSEDK__WG_C##N("=f")                                                                      \
               : "l"(a), "l"(b))
#define FUSEDK__WGMMA_RS(N, IA, IB, IACC, TY)                                                              \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IACC ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N     \
               "k16.f32." #TY "." #TY " " FUSEDK__WG_D(N) ", " IA ", %" #IB ", p, 1, 1, 1;\n}"            \
               : FUSEDK__WG_C##N("+f")                                                                      \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc))

template <typename T, int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t a, uint64_t b, int acc) {
  static_assert(N == 16 || N == 64 || N == 80 || N == 96 || N == 128 || N == 160 || N == 192 || N == 256,
                "tiles of 16, 64, 80, 96, 128, 160, 192 or 256 columns");
  constexpr bool bf = std::is_same<T, __nv_bfloat16>::value;
  if constexpr (N == 16) { FUSEDK__WG_TYPED(FUSEDK__WGMMA_SS, 16, 8, 9, 10) }
  else if constexpr (N == 64) { FUSEDK__WG_TYPED(FUSEDK__WGMMA_SS, 64, 32, 33, 34) }
  else if constexpr (N == 80) { FUSEDK__WG_TYPED(FUSEDK__WGMMA_SS, 80, 40, 41, 42) }
  else if constexpr (N == 96) { FUSEDK__WG_TYPED(FUSEDK__WGMMA_SS, 96, 48, 49, 50) }
  else if constexpr (N == 128) { FUSEDK__WG_TYPED(FUSEDK__WGMMA_SS, 128, 64, 65, 66) }
  else if constexpr (N == 160) { FUSEDK__WG_TYPED(FUSEDK__WGMMA_SS, 160, 80, 81, 82) }
  else if constexpr (N == 192) { FUSEDK__WG_TYPED(FUSEDK__WGMMA_SS, 192, 96, 97, 98) }
  else { FUSEDK__WG_TYPED(FUSEDK__WGMMA_SS, 256, 128, 129, 130) }
}
// d = a b: wgmma_ss with the accumulator written, not read (no registers to prepare for it)
template <typename T, int N> __device__ __forceinline__ void wgmma_ss0(float (&d)[N / 8][4], uint64_t a, uint64_t b) {
  static_assert(N == 64 || N == 80 || N == 128 || N == 192, "score tiles of 64, 80, 128 or 192 keys");
  constexpr bool bf = std::is_same<T, __nv_bfloat16>::value;
  if constexpr (N == 64) { FUSEDK__WG_TYPED(FUSEDK__WGMMA_SS0, 64, 32, 33) }
  else if constexpr (N == 80) { FUSEDK__WG_TYPED(FUSEDK__WGMMA_SS0, 80, 40, 41) }
  else if constexpr (N == 128) { FUSEDK__WG_TYPED(FUSEDK__WGMMA_SS0, 128, 64, 65) }
  else { FUSEDK__WG_TYPED(FUSEDK__WGMMA_SS0, 192, 96, 97) }
}
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b, int acc) {
  static_assert(N == 64 || N == 128 || N == 256, "output tiles of 64, 128 or 256 columns");
  constexpr bool bf = std::is_same<T, __nv_bfloat16>::value;
  if constexpr (N == 64) { FUSEDK__WG_TYPED(FUSEDK__WGMMA_RS, 64, "{%32, %33, %34, %35}", 36, 37) }
  else if constexpr (N == 128) { FUSEDK__WG_TYPED(FUSEDK__WGMMA_RS, 128, "{%64, %65, %66, %67}", 68, 69) }
  else { FUSEDK__WG_TYPED(FUSEDK__WGMMA_RS, 256, "{%128, %129, %130, %131}", 132, 133) }
}
// The integer form (attention_int8's S): d[64 x N] (+)= a[64 x 32] b[32 x N] in int32, exact; a
// (s8) and b (s8) K-major in shared memory. The accumulator's layout is the float forms'.
#define FUSEDK__WGMMA_I8_SS(N, IA, IB, SCALE, K)                                                          \
  asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k32.s32.s8.s8 " FUSEDK__WG_D(N) ", %" #IA ", %" #IB \
               ", " #SCALE ";"                                                                             \
               : FUSEDK__WG_C##N(K)                                                                        \
               : "l"(a), "l"(b))
// acc 0: d = a b (the accumulator written, not read)
template <int N> __device__ __forceinline__ void wgmma_i8_ss(int (&d)[N / 8][4], uint64_t a, uint64_t b, bool acc) {
  static_assert(N == 64 || N == 128, "score tiles of 64 or 128 keys");
  if constexpr (N == 64) {
    if (acc) FUSEDK__WGMMA_I8_SS(64, 32, 33, 1, "+r");
    else FUSEDK__WGMMA_I8_SS(64, 32, 33, 0, "=r");
  } else {
    if (acc) FUSEDK__WGMMA_I8_SS(128, 64, 65, 1, "+r");
    else FUSEDK__WGMMA_I8_SS(128, 64, 65, 0, "=r");
  }
}
#endif // __CUDA_ARCH_FEAT_SM90_ALL

#if !FUSEDK__PART_ALL
#pragma nv_diag_default 177
#endif

#if FUSEDK__PART_NORM
// ---------------------------------------------------------------------------------------------
// [norm] one kernel for rmsnorm, layernorm, adaln and residual_tanh_gated_rmsnorm (Mochi).
//
// Launch shape (plan_norm): a group of G threads normalizes one row; a block holds blockDim.y
// groups. Rows under 32 vectors: an aligned sub-warp per row, sums by shuffles alone. Longer
// rows: G (a multiple of 32) threads per row, warp sums combined through shared memory.
// Memory traffic is the minimum: each input is read once and each output written once while the
// row is cached (NV > 0). Each thread issues every load its row needs before the first use: NV
// 16-byte vectors of each row stream (x; the residual or Mochi's base) and of each per-column
// operand (weight/bias, scale/shift, gate) it caches. With RMS statistics they go to shared memory
// through cp.async, so a row waiting on DRAM holds no registers: an SM keeps as many rows in
// flight as its shared memory takes (a register cache allowed 8-10, and bandwidth tracked that
// number). LayerNorm statistics (layernorm, adaln's layer norm) are issue-bound: they keep the
// cache in registers while it fits there, layernorm's (and adaln's at one wave of rows) without
// its column operands, read from L1 in the epilogue (enum Cache, launch_norm_vec); the scalar
// path caches in registers too. A row then costs one memory round trip, a reduction and its
// stores. Longer rows (NV == 0) are re-read per pass; a row then comes back from L2.
// Statistics: RMSNorm one pass (sum of squares); LayerNorm one pass (the sums of v and v^2 in one
// reduction), with a second pass over v - mean for the rows where that would lose bits (a mean
// far from zero against the standard deviation).
// What is fused is fixed at compile time (norm kind, residual, epilogue): a kernel carries only
// the registers and instructions its op uses.
// ---------------------------------------------------------------------------------------------

// rms/layernorm; adaln; Mochi; adaln with float32 scale and shift beside 16-bit rows (Wan keeps
// its modulation float32): those are read from L1 as float32 in the epilogue, never cached.
enum Epi { kAffine = 0, kAdaLN = 1, kGated = 2, kAdaLN32 = 3 };
__host__ __device__ constexpr bool is_adaln(int epi) { return epi == kAdaLN || epi == kAdaLN32; }

// Where a thread's cache of its row lives (launch_norm_vec picks): 16-byte vectors in shared
// memory (kStaged; single elements are in registers whatever the mode), in registers (kRegs), or
// the row streams in registers and the per-column operands not cached at all, read from L1 in the
// epilogue (kRowRegs: every row of an SM reads the same weight, bias, scale or shift).
enum Cache { kStaged = 0, kRegs = 1, kRowRegs = 2 };
__host__ __device__ constexpr bool cols_of(int epi, int cm) { return cm != kRowRegs && epi != kAdaLN32; } // cached columns

// Vectors a thread caches per slot k: the row streams and the per-column operands of a kind.
__host__ __device__ constexpr int cached_streams(bool ln, bool res, int epi, int cm) {
  return 1 + (res || epi == kGated) + (cols_of(epi, cm) ? 1 + (epi == kAdaLN || (epi == kAffine && ln)) : 0);
}

__host__ __device__ constexpr bool staged(int vb, int cm) { return vb == 16 && cm == kStaged; }
constexpr size_t stage_bytes(int nv, int vb, int cm, int streams, int threads) {
  return staged(vb, cm) ? (size_t)nv * 16 * streams * threads : 0;
}

// Register budget: ~40 registers of addressing, statistics and epilogue, plus a register cache
// of one register per 32-bit word of a slot, per stream. Deeper caches are capped at fewer
// threads per block so that each thread gets what it needs (no spills), and beyond 200 registers
// they are not instantiated. hold: the floats a slot the _fp8 forms hold (VEC; norm_rows' kHold:
// a register row of up to 32 values).
__host__ __device__ constexpr bool holds(int nv, int vb, int cm, int hold) {
  return hold > 0 && nv > 0 && nv * hold <= 32 && !staged(vb, cm);
}
constexpr int cache_regs(int nv, int vb, int cm, int streams, int hold) {
  return 40 + (staged(vb, cm) ? 0 : nv * streams * ((vb + 3) / 4)) + (holds(nv, vb, cm, hold) ? nv * hold : 0);
}
constexpr int max_threads(int nv, int vb, int cm, int streams, int hold) {
  const int r = cache_regs(nv, vb, cm, streams, hold);
  return r <= 64 ? 1024 : r <= 128 ? 512 : 256;
}
constexpr bool fits(int nv, int vb, int cm, int streams, int hold) { return cache_regs(nv, vb, cm, streams, hold) <= 200; }

extern __shared__ uint4 norm_stage[]; // the shared-memory cache, sized at launch
constexpr int kRedSums = 4; // LayerNorm's sums: two in pass 1, two in its second pass (RMS: one)
constexpr int kRedBytes = kRedSums * 32 * sizeof(float); // the reduction slots, static shared memory

// A thread's share of its row between passes (NV > 0): NS streams of NV vectors, slot (s, k).
// Shared memory (16-byte vectors): filled by cp.async (.cg: rows stream past L1; .ca: column
// operands, re-read by every row, stay in L1); each thread reads back only the slots it filled
// itself, so cp.async.wait_all orders them and no barrier is needed. Consecutive threads own
// consecutive 16 bytes of a slot: conflict-free. Registers (scalar path, kRegs, kRowRegs): opaque words.
// NV == 0: nothing cached, get() loads vector j from memory.
template <typename T, int VEC, int NV, int NS, int CM> struct RowCache {
  static constexpr bool kShared = staged(sizeof(T) * VEC, CM) && NV > 0;
  Raw<T, VEC> reg[kShared || NV == 0 ? 1 : NS][kShared || NV == 0 ? 1 : NV];
  uint4 *sm;  // this thread's slot (0, 0); slot (s, k) at sm[(s * NV + k) * stride]
  int stride; // threads per block

  __device__ __forceinline__ RowCache() {
    if constexpr (kShared) {
      sm = norm_stage + threadIdx.y * blockDim.x + threadIdx.x;
      stride = blockDim.x * blockDim.y;
    }
  }
  // COL: a per-column operand (L1-cached / read-only path)
  template <bool COL> __device__ __forceinline__ void put(int s, int k, const T *p) {
    if constexpr (kShared) {
      const unsigned d = (unsigned)__cvta_generic_to_shared(sm + (s * NV + k) * stride);
      if constexpr (COL) asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(d), "l"(p) : "memory");
      else asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(p) : "memory");
    } else if constexpr (NV > 0) {
      reg[s][k] = ld<T, VEC, COL>(p);
    }
  }
  __device__ __forceinline__ void wait() const {
    if constexpr (kShared) asm volatile("cp.async.wait_all;" ::: "memory");
  }
  // slot (s, k) as floats; NV == 0: vector j at p, loaded now
  template <bool COL> __device__ __forceinline__ void get(int s, int k, const T *p, int64_t j, float (&v)[VEC]) const {
    if constexpr (kShared) {
      const uint4 u = sm[(s * NV + k) * stride];
      Raw<T, VEC> r;
      r.w[0] = u.x, r.w[1] = u.y, r.w[2] = u.z, r.w[3] = u.w;
      to_floats<T, VEC>(r, v);
    } else if constexpr (NV > 0) {
      to_floats<T, VEC>(opaque<T, VEC>(reg[s][k]), v);
    } else {
      load<T, VEC, COL>(p + j * VEC, v);
    }
  }
};

// A row's statistics, by the G threads of its group (row_val(k, j, v): the row's vector j, the
// thread's k-th): LayerNorm's mean = K + dm (K = 0 unless the second pass ran), rstd
struct NormStats {
  float K, dm, rstd;
};
template <int VEC, bool LN, int EPI, int NV, typename RowVal>
__device__ __forceinline__ NormStats norm_stats(RowVal &&row_val, const fusedk__norm_args &a, int64_t nvec, int G,
                                                float inv_d, float (*red)[32]) {
  // LayerNorm's sums of e = v - M and e^2 over this thread's share of the row (pass 1: M = 0)
  auto centred_sums = [&](float M, float(&t)[2]) {
    for_each_vec<NV>(nvec, G, [&](int k, int64_t j) {
      float v[VEC];
      row_val(k, j, v);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float e = v[i] - M;
        t[0] += e, t[1] = fmaf(e, e, t[1]);
      }
    });
  };

  // pass 1: RMSNorm sums v^2; LayerNorm sums v and v^2 in one reduction (one barrier)
  float s[LN ? 2 : 1] = {};
  if constexpr (LN)
    centred_sums(0.f, s);
  else
    for_each_vec<NV>(nvec, G, [&](int k, int64_t j) {
      float v[VEC];
      row_val(k, j, v);
#pragma unroll
      for (int i = 0; i < VEC; ++i) s[0] += v[i] * v[i];
    });
  group_sums(s, G, red);
  float K = 0.f, dm = 0.f, var;
  if constexpr (LN) {
    dm = s[0] * inv_d;
    // var = E[v^2] - mean^2 loses about (1 + mean^2 / var) ulps to the subtraction: at most ~9
    // while the mean is within sqrt(8) standard deviations of zero (the common row: one pass, one
    // barrier; a shift by x[0] for every row costs more than the rare second pass). A row whose
    // mean is further out (values close together far from zero) takes a second pass from the
    // float M = mean: mean(v - M) fixes the mean (its error is first order in the output),
    // mean((v - M)^2) the variance, and the epilogue is centred on M (v alone would round at M's
    // scale). A row group decides for itself (its results do not depend on its neighbours); the
    // whole warp or block joins the shuffles and barriers.
    var = fmaf(s[1], inv_d, -dm * dm);
    // NaN included; var = Inf: v^2 overflowed, v - M may not (rows far from zero, |v| > ~1e19).
    // (Rows of |v| beyond FLT_MAX / D overflow the sum of v itself and come out NaN.)
    const bool again = !(dm * dm <= 8.f * var) || var == INFINITY;
    const bool any = G > 32 ? (blockDim.y > 1 ? __syncthreads_or(again) : again) : __any_sync(0xffffffffu, again);
    if (any) {
      const float M = dm; // the mean (K is still 0)
      float t[2] = {0.f, 0.f};
      if (again) centred_sums(M, t);
      group_sums(t, G, red + 2); // a slower warp may still read red[0], red[1]
      if (again) { // mean = M + de: e was measured from M itself
        const float de = t[0] * inv_d;
        var = fmaxf(fmaf(t[1], inv_d, -de * de), 0.f);
        K = M, dm = de;
      }
    }
  } else {
    var = EPI == kGated && a.exact ? s[0] / (float)a.D : s[0] * inv_d; // exact: PyTorch's mean
  }
  return {K, dm, rsqrtf(var + a.eps)};
}

// One vector's epilogue after the normalization n: adaln's optional affine inside the norm (AFF:
// the row's kernel path with it, rare: not cached), then the modulation n (1 + scale) + shift;
// the gated form's base + n tanh(gate) (PyTorch's roundings when exact); else weight and bias
// where given. col0, col1: the vector's per-column operands (cached or loaded); base: the gated
// form's base
template <typename T, int VEC, int EPI, bool C1, bool AFF, typename Col0, typename Col1, typename Base>
__device__ __forceinline__ void norm_epilogue(float (&n)[VEC], const fusedk__norm_args &a, int64_t d, bool has_c0,
                                            bool has_c1, Col0 &&col0, Col1 &&col1, Base &&base) {
  float q[VEC];
  if constexpr (is_adaln(EPI)) {
    if (AFF && a.weight) {
      load<T, VEC, true>(static_cast<const T *>(a.weight) + d, q);
#pragma unroll
      for (int i = 0; i < VEC; ++i) n[i] *= q[i];
    }
    if (AFF && a.bias) {
      load<T, VEC, true>(static_cast<const T *>(a.bias) + d, q);
#pragma unroll
      for (int i = 0; i < VEC; ++i) n[i] += q[i];
    }
    col0(q);
#pragma unroll
    for (int i = 0; i < VEC; ++i) n[i] *= 1.f + q[i];
    col1(q);
#pragma unroll
    for (int i = 0; i < VEC; ++i) n[i] += q[i];
  } else if constexpr (EPI == kGated) {
    float t[VEC];
    col0(t);
#pragma unroll
    for (int i = 0; i < VEC; ++i) t[i] = tanhf(t[i]);
    if (a.exact) round_all<T>(t);
#pragma unroll
    for (int i = 0; i < VEC; ++i) n[i] *= t[i];
    if (a.exact) round_all<T>(n);
    base(q);
#pragma unroll
    for (int i = 0; i < VEC; ++i) n[i] += q[i];
  } else {
    if (has_c0) {
      col0(q);
#pragma unroll
      for (int i = 0; i < VEC; ++i) n[i] *= q[i];
    }
    if (C1 && has_c1) {
      col1(q);
#pragma unroll
      for (int i = 0; i < VEC; ++i) n[i] += q[i];
    }
  }
}

// The kernel body; norm_rows_kernel and norm_rows_reg_kernel below are its entry points. Q8: the
// _fp8 forms (e4m3 y and a float32 scale a row), a kernel of their own.
template <typename T, int VEC, int NV, bool LN, bool RES, int EPI, int CM, bool Q8>
__device__ __forceinline__ void norm_rows(const fusedk__norm_args &a, int64_t rows, float inv_d) {
  constexpr bool S2 = RES || EPI == kGated;                     // second row stream: residual or base
  constexpr bool C1 = is_adaln(EPI) || (EPI == kAffine && LN); // second column operand: bias or shift
  constexpr int kX = 0, kS = 1, kC0 = 1 + S2, kC1 = kC0 + 1; // cache streams
  __shared__ float red[LN ? kRedSums : 1][32]; // <= kRedBytes: a slot per warp and sum; LayerNorm's second pass: red[2], red[3]
  const int G = blockDim.x;
  const int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  const bool live = row < rows; // dead groups still join the block's barriers
  // (b, l) of the row without a 64-bit division on the path to the first load where possible
  int64_t b = 0, l = 0;
  if (live) {
    if (a.B == 1) {
      l = row;
    } else if (a.L == 1) {
      b = row;
    } else if (rows <= 0xffffffffll) {
      b = (uint32_t)row / (uint32_t)a.L;
      l = row - b * a.L;
    } else {
      b = row / a.L, l = row % a.L;
    }
  }
  const int64_t nvec = live ? (int64_t)((uint64_t)a.D / VEC) : 0;
  const T *x = at<T>(a.x, b, l);
  const T *s2 = RES ? at<T>(a.res, b, l) : EPI == kGated ? at<T>(a.base, b, l) : nullptr;
  // per-column operands: weight/bias, scale/shift of sample b, gate of sample b
  using C = std::conditional_t<EPI == kAdaLN32, float, T>; // the per-column operands' type
  const C *c0 = EPI == kAffine ? static_cast<const C *>(a.weight) : is_adaln(EPI) ? at<C>(a.scale, b, 0) : at<C>(a.gate, b, 0);
  const C *c1 = !C1 ? nullptr : EPI == kAffine ? static_cast<const C *>(a.bias) : at<C>(a.shift, b, 0);

  constexpr bool kCols = cols_of(EPI, CM);
  RowCache<T, VEC, NV, cached_streams(LN, RES, EPI, CM), CM> cache;
  // a per-column operand's vector: cached, or loaded now (L1: every row of the SM reads it)
  auto col = [&](int s, int k, const auto *p, int64_t j, float(&v)[VEC]) {
    if constexpr (kCols) cache.template get<true>(s, k, p, j, v);
    else load<C, VEC, true>(p + j * VEC, v);
  };
  if constexpr (NV > 0) { // row streams first (DRAM), then column operands (L1/L2 hits)
    for_each_vec<NV>(nvec, G, [&](int k, int64_t j) {
      cache.template put<false>(kX, k, x + j * VEC);
      if constexpr (S2) cache.template put<false>(kS, k, s2 + j * VEC); // not read-only: base may alias y
    });
    if constexpr (kCols)
      for_each_vec<NV>(nvec, G, [&](int k, int64_t j) {
        if (c0) cache.template put<true>(kC0, k, c0 + j * VEC);
        if (C1 && c1) cache.template put<true>(kC1, k, c1 + j * VEC);
      });
  }
  // v = x (+ residual), in float, unrounded
  auto row_val = [&](int k, int64_t j, float(&v)[VEC]) {
    cache.template get<false>(kX, k, x, j, v);
    if constexpr (RES) {
      float r[VEC];
      cache.template get<false>(kS, k, s2, j, r);
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] += r[i];
    }
  };

  cache.wait();

  // Q8 with a register row of up to 32 values a thread (kHold): v = x (+ residual) made once as
  // floats and held, its normalized values then in its place until the e4m3 pass (the 16-bit
  // kernels keep only the packed words and convert them each pass: their occupancy). A staged,
  // deeper or uncached row makes its values again each pass.
  constexpr bool kHold = holds(NV, VEC * (int)sizeof(T), CM, Q8 ? VEC : 0);
  T *ro = RES && a.res_out.p ? at<T>(a.res_out, b, l) : nullptr;
  float hold[kHold ? NV : 1][VEC];
  if constexpr (kHold)
    for_each_vec<NV>(nvec, G, [&](int k, int64_t j) {
      row_val(k, j, hold[k]);
      if (RES && ro) store_cs<T, VEC>(ro + j * VEC, hold[k]); // (else the last pass: ro may be res)
    });
  auto val = [&](int k, int64_t j, float(&v)[VEC]) {
    if constexpr (kHold) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] = hold[k][i];
    } else {
      row_val(k, j, v);
    }
  };
  const NormStats st = norm_stats<VEC, LN, EPI, NV>(val, a, nvec, G, inv_d, red);
  const float K = st.K, dm = st.dm, rstd = st.rstd;

  // final pass: epilogue and stores
  const float c = -dm * rstd; // LayerNorm: (v - K - dm) * rstd as one FMA; v - K is exact near K = M
  // n of v; KZ: K is +0 (no second statistics pass: v - K is v, one instruction less a value)
  auto norm_of = [&](auto kz, const float(&v)[VEC], float(&n)[VEC]) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) n[i] = LN ? fmaf(decltype(kz)::value ? v[i] : v[i] - K, rstd, c) : v[i] * rstd;
  };
  // AFF: adaln with its affine inside the norm; in the _fp8 forms a uniform branch picks the path
  // (not a predicate a vector)
  auto finish = [&](auto aff) {
    constexpr bool AFF = decltype(aff)::value;
    auto epilogue = [&](int k, int64_t j, float(&n)[VEC]) {
      norm_epilogue<T, VEC, EPI, C1, AFF>(n, a, j * VEC, c0 != nullptr, c1 != nullptr,
                                          [&](auto &q) { col(kC0, k, c0, j, q); },
                                          [&](auto &q) { col(kC1, k, c1, j, q); },
                                          [&](auto &q) { cache.template get<false>(kS, k, s2, j, q); });
    };
    auto out_val = [&](int k, int64_t j, float(&v)[VEC], float(&n)[VEC]) {
      row_val(k, j, v);
      norm_of(std::false_type(), v, n);
      epilogue(k, j, n);
    };
    if constexpr (Q8) { // the row's values, their amax, then e4m3
      float m = 0.f;
      if constexpr (kHold) {
        auto pass = [&](auto kz) {
          for_each_vec<NV>(nvec, G, [&](int k, int64_t j) {
            float n[VEC];
            norm_of(kz, hold[k], n);
            epilogue(k, j, n);
#pragma unroll
            for (int i = 0; i < VEC; ++i) m = amax_nan(m, n[i]), hold[k][i] = n[i];
          });
        };
        if (__float_as_uint(K) == 0u) pass(std::true_type()); // uniform: the group's statistics
        else pass(std::false_type());
      } else {
        for_each_vec<NV>(nvec, G, [&](int k, int64_t j) {
          float v[VEC], n[VEC];
          out_val(k, j, v, n);
#pragma unroll
          for (int i = 0; i < VEC; ++i) m = amax_nan(m, n[i]);
        });
      }
      m = group_amax(m, G, red);
      const float inv = q_inv<448>(m);
      uint8_t *q = at<uint8_t>(a.y, b, l);
      for_each_vec<NV>(nvec, G, [&](int k, int64_t j) {
        float n[VEC];
        if constexpr (kHold) {
#pragma unroll
          for (int i = 0; i < VEC; ++i) n[i] = hold[k][i];
        } else {
          float v[VEC];
          out_val(k, j, v, n);
          if (RES && ro) store_cs<T, VEC>(ro + j * VEC, v);
        }
        st_bytes<VEC>(q + j * VEC, e4m3_of<VEC>(n, inv));
      });
      if (live && threadIdx.x == 0) *at<float>(a.ys, b, l) = __fdiv_rn(m, 448.f);
    } else {
      T *y = at<T>(a.y, b, l);
      for_each_vec<NV>(nvec, G, [&](int k, int64_t j) {
        float v[VEC], n[VEC];
        out_val(k, j, v, n);
        if (RES && ro) store_cs<T, VEC>(ro + j * VEC, v);
        store_cs<T, VEC>(y + j * VEC, n);
      });
    }
  };
  if constexpr (!Q8) finish(std::true_type()); // 16-bit kernels: the affine tests stay a vector (their registers tuned)
  else if (is_adaln(EPI) && (a.weight || a.bias)) finish(std::true_type());
  else finish(std::false_type());
}

// Entry points. LayerNorm's rows of two and four vectors a thread cached in registers with their
// column operands (kRegs: adaln's) run under a register cap that keeps more blocks an SM
// resident (ptxas -v, sm_90a): four vectors (48 registers of row, scale and shift) take 75 a
// thread left alone, 24 warps an SM; at 72, 28 (9 blocks of 96 threads at D = 3072), with at
// most 16 bytes of spill, not reloaded on the common path. Two vectors take 50; at 48, 14 blocks
// of 96 threads (D = 1152), not 12. The _fp8 forms hold their row as floats (32 registers more
// at four vectors): uncapped.
constexpr int reg_cap(int nv, bool q8) { return q8 ? 0 : nv == 4 ? 72 : nv == 2 ? 48 : 0; } // 0: no cap
template <typename T, int VEC, int NV, bool LN, bool RES, int EPI, int CM, bool Q8>
__global__ void __launch_bounds__(max_threads(NV, VEC * (int)sizeof(T), CM, cached_streams(LN, RES, EPI, CM), Q8 ? VEC : 0))
    norm_rows_kernel(const fusedk__norm_args a, int64_t rows, float inv_d) {
  norm_rows<T, VEC, NV, LN, RES, EPI, CM, Q8>(a, rows, inv_d);
}
template <typename T, int VEC, int NV, bool RES, int EPI, bool Q8>
__global__ void __maxnreg__(reg_cap(NV, Q8)) norm_rows_reg_kernel(const fusedk__norm_args a, int64_t rows, float inv_d) {
  norm_rows<T, VEC, NV, true, RES, EPI, kRegs, Q8>(a, rows, inv_d);
}
template <typename T, int VEC, int NV, bool LN, bool RES, int EPI, int CM, bool Q8> constexpr auto norm_entry() {
  if constexpr (CM == kRegs && reg_cap(NV, Q8) > 0) return norm_rows_reg_kernel<T, VEC, NV, RES, EPI, Q8>;
  else return norm_rows_kernel<T, VEC, NV, LN, RES, EPI, CM, Q8>;
}

// The launch shape for rows of nvec vectors: NV vectors cached per thread, G threads per row.
struct NormPlan {
  int nv, g, rows_per_block;
};

// Rows under 32 vectors: a sub-warp per row. Longer rows: the smallest cache depth that needs at
// most g_max threads per row and whose cache fits (shared memory up to smem_max, registers);
// blocks of >= 128 threads. Every shape that caches the row runs close to the best plan, so
// g_max 128 (256 past 512 vectors, for rows of one wave and layernorm's past 256: see
// launch_norm_vec) needs no per-shape table.
NormPlan plan_norm(int64_t nvec, int vb, int cm, int streams, int hold, int g_max, size_t smem_max) {
  NormPlan p{1, 1, 1};
  if (nvec < 32) { // a sub-warp group per row, 256 threads per block
    while (p.g < nvec) p.g *= 2;
    p.rows_per_block = 256 / p.g; // a cache of at most 256 x 4 x 16 B = 16 KB: always fits
    return p;
  }
  int nv_max = 16; // the deepest cache that fits; only it may use more than g_max threads
  while (!fits(nv_max, vb, cm, streams, hold)) nv_max /= 2;
  for (int nv : {1, 2, 4, 8, 16}) {
    const int64_t g = (nvec + nv - 1) / nv;
    const int g32 = (int)((g + 31) / 32 * 32), rpb = g32 < 128 ? 128 / g32 : 1;
    if (nv <= nv_max && g <= std::min<int64_t>(nv == nv_max ? 1024 : g_max, max_threads(nv, vb, cm, streams, hold)) &&
        stage_bytes(nv, vb, cm, streams, g32 * rpb) <= smem_max)
      return NormPlan{nv, g32, rpb};
  }
  return NormPlan{0, 512, 1}; // re-read from L2
}

#ifdef FUSEDK_TUNING
// bench/tune_norm.py sets a launch shape through fusedk__tune_norm_plan (a measuring aid, not
// API: a process-wide setting, not thread safe); one that does not fit the row is ignored.
// nv = -2 sets only g_max. Built only with -Dtuning=true (meson), i.e. -DFUSEDK_TUNING.
NormPlan g_tune_plan{-1, 0, 0};

bool plan_valid(const NormPlan &p, int64_t nvec, int vb, int cm, int streams, int hold, size_t smem_max) {
  const bool gok = p.g > 32 ? p.g % 32 == 0 : (p.g & (p.g - 1)) == 0;
  const bool nvok = p.nv == 0 || p.nv == 1 || p.nv == 2 || p.nv == 4 || p.nv == 8 || p.nv == 16;
  return gok && nvok && p.g >= 1 && p.rows_per_block >= 1 && p.g * p.rows_per_block <= max_threads(p.nv, vb, cm, streams, hold) &&
         (p.g >= 32 || p.rows_per_block * p.g % 32 == 0) && (p.nv == 0 || (int64_t)p.nv * p.g >= nvec) &&
         (p.nv == 0 || fits(p.nv, vb, cm, streams, hold)) && stage_bytes(p.nv, vb, cm, streams, p.g * p.rows_per_block) <= smem_max;
}
#endif

// One launch: the checked arguments, the row count, the stream, and the most dynamic shared
// memory a block of this device may take (after the reduction slots).
struct NormLaunch {
  const fusedk__norm_args &a;
  int64_t rows;
  cudaStream_t s;
  size_t smem_max;
  int device;
};

template <typename T, int VEC, bool LN, bool RES, int EPI, bool Q8> cudaError_t launch_norm_vec(const NormLaunch &L) {
  constexpr int vb = VEC * (int)sizeof(T);
  // LayerNorm statistics are issue-bound, so a register cache pays for layernorm and adaln and
  // not for rmsnorm, whose rows stream. A row too long for registers is
  // staged where it fits in shared memory (adaln's cached rows), else re-read from L2 (kRowRegs
  // rows hold up to 8192 vectors: past that no stage fits). The scalar path caches in registers.
  constexpr bool can_reg = LN && vb == 16;
  constexpr bool layernorm = can_reg && EPI == kAffine; // layernorm's 16-byte rows
  const fusedk__norm_args &a = L.a;
  const int64_t nvec = a.D / VEC;
  // rows all resident at once at one vector a thread (one wave): no other rows hide a row's latency
  const bool one_wave = L.rows * nvec <= (int64_t)device_sms(L.device) * 2048;
  // One wave: one vector a thread, up to 256 threads a row, shortens each thread's chain where
  // no other rows hide it (not adaln, whose scale and shift then leave the cache, nor rows of
  // several waves, which hide each other). The test counts vectors, not threads rounded to warps:
  // approximate. A row's launch shape, so its reduction order and last bits, then depends on
  // the row count (one call's results are still the same run to run).
  const bool spread = (!LN || layernorm) && nvec <= 256 && one_wave;
  // LayerNorm's registers: layernorm leaves weight and bias to L1 (kRowRegs: 45 registers, not
  // 72, at four vectors a thread; 10 blocks of 128 threads an SM, not 7). adaln does so for one
  // wave of rows; with more rows its per-sample scale and shift are worth their registers.
  int cm = !can_reg ? kStaged : layernorm || one_wave ? kRowRegs : kRegs;
  // layernorm's rows of 257-512 vectors: up to 256 threads a row, two vectors a thread (not
  // adaln's cached rows, whose operands then take twice the registers a thread)
  int g_max = nvec > 512 || spread || (layernorm && nvec > 256) ? 256 : 128;
#ifdef FUSEDK_TUNING
  if (g_tune_plan.nv == -2) g_max = g_tune_plan.g;
#endif
  int st = cached_streams(LN, RES, EPI, cm);
  constexpr int hold = Q8 ? VEC : 0;
  NormPlan p = plan_norm(nvec, vb, cm, st, hold, g_max, L.smem_max);
  if (cm != kStaged && p.nv == 0)
    cm = kStaged, st = cached_streams(LN, RES, EPI, cm), p = plan_norm(nvec, vb, cm, st, hold, g_max, L.smem_max);
#ifdef FUSEDK_TUNING
  if (g_tune_plan.nv >= 0 && plan_valid(g_tune_plan, nvec, vb, cm, st, hold, L.smem_max)) p = g_tune_plan;
#endif
  const dim3 block(p.g, p.rows_per_block);
  const int64_t grid = (L.rows + p.rows_per_block - 1) / p.rows_per_block;
  if (grid > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const unsigned gr = (unsigned)grid;
  const size_t smem = stage_bytes(p.nv, vb, cm, st, p.g * p.rows_per_block);
  auto go = [&](auto cm_c) {
    constexpr int CM = decltype(cm_c)::value;
    return dispatch_int<0, 1, 2, 4, 8, 16>(p.nv, [&](auto nv) {
      constexpr int NV = decltype(nv)::value;
      // only the cache depths that fit (plan never picks others)
      if constexpr (NV == 0 || fits(NV, vb, CM, cached_streams(LN, RES, EPI, CM), hold)) {
        constexpr auto kernel = norm_entry<T, VEC, NV, LN, RES, EPI, CM, Q8>();
        const cudaError_t err = smem_opt_in<kernel>(smem, kRedBytes, L.device);
        if (err == cudaSuccess) kernel<<<gr, block, smem, L.s>>>(a, L.rows, 1.f / (float)a.D); // 1/D: as the device rounds it
        return err;
      } else {
        return cudaErrorInvalidConfiguration;
      }
    });
  };
  cudaError_t e;
  if constexpr (!can_reg) e = go(int_c<kStaged>());
  else if constexpr (layernorm) e = cm == kRowRegs ? go(int_c<kRowRegs>()) : go(int_c<kStaged>()); // never kRegs
  else e = dispatch_int<kStaged, kRegs, kRowRegs>(cm, [&](auto c) { return go(c); });
  return e != cudaSuccess ? e : cudaGetLastError();
}

// The 16-byte vector path or the scalar one (same kernel, one element per access); the 16-bit
// output or (q8) the _fp8 forms' e4m3 one (Mochi's gated form has none).
template <typename T, bool LN, bool RES, int EPI>
cudaError_t launch_epi(bool vec, const NormLaunch &L) {
  auto go = [&](auto q8) {
    constexpr bool Q8 = decltype(q8)::value;
    return vec ? launch_norm_vec<T, 16 / sizeof(T), LN, RES, EPI, Q8>(L) : launch_norm_vec<T, 1, LN, RES, EPI, Q8>(L);
  };
  if constexpr (EPI != kGated)
    if (L.a.q8) return go(std::true_type());
  return go(std::false_type());
}

// 16-byte vectors need every pointer 16-byte aligned, every row stride and D a multiple of
// the vector. Kinds: rmsnorm (+residual), layernorm, adaln (layer/rms), Mochi (rms).
template <typename T> cudaError_t launch_norm(const NormLaunch &L) {
  constexpr int V = 16 / sizeof(T);
  const fusedk__norm_args &a = L.a;
  bool vec = a.D % V == 0 && aligned16(a.weight) && aligned16(a.bias);
  for (const fusedk__rows *r : {&a.x, &a.res, &a.res_out, &a.y, &a.base, &a.scale, &a.shift, &a.gate})
    vec = vec && aligned16(r->p) && r->sb % V == 0 && r->sl % V == 0;
  switch (a.op) {
    case FUSEDK_OP_RMSNORM:
      return a.res.p ? launch_epi<T, false, true, kAffine>(vec, L) : launch_epi<T, false, false, kAffine>(vec, L);
    case FUSEDK_OP_LAYERNORM: return launch_epi<T, true, false, kAffine>(vec, L);
    case FUSEDK_OP_ADALN:
      if constexpr (sizeof(T) == 2)
        if (a.mod != a.scalar) // float32 scale and shift
          return a.rms ? launch_epi<T, false, false, kAdaLN32>(vec, L) : launch_epi<T, true, false, kAdaLN32>(vec, L);
      return a.rms ? launch_epi<T, false, false, kAdaLN>(vec, L) : launch_epi<T, true, false, kAdaLN>(vec, L);
    case FUSEDK_OP_RESIDUAL_TANH_GATED_RMSNORM: return launch_epi<T, false, false, kGated>(vec, L);
  }
  return cudaErrorInvalidValue;
}
#endif // FUSEDK__PART_NORM

#if FUSEDK__PART_ELEMENTWISE
// ---------------------------------------------------------------------------------------------
// [elementwise] act, silu_fma, gated_residual, glu, glu_pair: one kernel over rows of D elements
// (glu: the rows of x's two halves, D = H; compact tensors without a per-sample operand: one row
// of every element).
//
// Launch shape (plan_ew): a block moves one chunk of U * G 16-byte vectors of a row, U vectors a
// thread, loads first, and exits (no grid-stride loop: the block scheduler balances the SMs).
// Each vector is read once per input and written once, streaming; the per-sample gate of
// gated_residual goes through the read-only path (re-read by every row of its sample).
// The activations (act_f32) are in [numerics]: [linear] uses them too.
// ---------------------------------------------------------------------------------------------

// diffusion_step's coefficients as float32 (the math of every kernel), once per thread
struct StepC { float c[FUSEDK__N_C]; };

// One element of diffusion_step: m = CFG combine, then Euler or DDIM, then the blend.
template <int SAMPLER>
__device__ __forceinline__ float step_f32(const StepC &st, bool has_u, bool has_p, float x, float cond, float u, float prev) {
  const float *c = st.c;
  const float m = has_u ? fmaf(c[FUSEDK__C_GUIDANCE], cond - u, u) : cond;
  float r;
  if constexpr (SAMPLER == FUSEDK_SAMPLER_EULER) {
    r = fmaf(c[FUSEDK__C_DT], m, x);
  } else {
    float x0 = fmaf(-c[FUSEDK__C_SQRT_1MA], m, x) * c[FUSEDK__C_RSQRT_A];
    const float cl = c[FUSEDK__C_CLAMP];
    if (cl > 0.f) x0 = x0 < -cl ? -cl : x0 > cl ? cl : x0; // NaN passes
    r = fmaf(c[FUSEDK__C_SQRT_AP], x0, c[FUSEDK__C_SQRT_1MAP] * m);
  }
  return has_p ? fmaf(c[FUSEDK__C_BLEND], r - prev, prev) : r;
}

template <typename T, int VEC, int OP, int KIND, int U>
__global__ void __launch_bounds__(256) elementwise_rows_kernel(const fusedk__ew_args a, int64_t rows, uint32_t cpr) {
  const int G = blockDim.x;
  [[maybe_unused]] StepC st;
  if constexpr (OP == FUSEDK_OP_DIFFUSION_STEP)
#pragma unroll
    for (int k = 0; k < FUSEDK__N_C; ++k) st.c[k] = (float)a.c[k];
  // the block's chunk c of rows q * blockDim.y ... (32-bit: the grid is); one row (compact
  // tensors): no division
  const uint32_t q = rows == 1 ? 0 : cpr == 1 ? blockIdx.x : blockIdx.x / cpr, c = blockIdx.x - q * cpr;
  const int64_t row = (int64_t)q * blockDim.y + threadIdx.y;
  if (row >= rows) return; // no barriers below
  int64_t b = 0, l = row; // (b, l) without a 64-bit division where possible
  if (a.B > 1) {
    if (a.L == 1) b = row, l = 0;
    else if (rows <= 0xffffffffll) b = (uint32_t)row / (uint32_t)a.L, l = row - b * a.L;
    else b = row / a.L, l = row % a.L;
  }
  const int64_t nvec = a.D / VEC;
  const T *p0 = at<T>(a.in[0], b, l);
  const T *p1 = OP == FUSEDK_OP_ACT ? nullptr : at<T>(a.in[1], b, l);
  const T *p2 = OP == FUSEDK_OP_SILU_FMA || OP == FUSEDK_OP_DIFFUSION_STEP ? at<T>(a.in[2], b, l) : nullptr;
  const T *p3 = OP == FUSEDK_OP_DIFFUSION_STEP ? at<T>(a.in[3], b, l) : nullptr;
  // gated_residual's gate: T, or float32 beside 16-bit rows (KIND 1)
  using GT = std::conditional_t<OP == FUSEDK_OP_GATED_RESIDUAL && KIND == 1, float, T>;
  const GT *pg = OP == FUSEDK_OP_GATED_RESIDUAL ? at<GT>(a.in[2], b, l) : nullptr;
  T *y = at<T>(a.y, b, l);
  // N vectors j, j + G, ..., every load issued before the first store (an output aliases an
  // input only exactly, so each element's own load still precedes its store)
  auto step = [&](int64_t j, auto n_c) {
    constexpr int N = decltype(n_c)::value;
    float v[N][VEC];
    [[maybe_unused]] float u[N][VEC], w[N][VEC], z[N][VEC]; // act reads one input
#pragma unroll
    for (int k = 0; k < N; ++k) {
      load<T, VEC>(p0 + (j + k * G) * VEC, v[k]);
      if constexpr (OP != FUSEDK_OP_ACT) load<T, VEC>(p1 + (j + k * G) * VEC, u[k]);
      if constexpr (OP == FUSEDK_OP_SILU_FMA) load<T, VEC>(p2 + (j + k * G) * VEC, w[k]);
      if constexpr (OP == FUSEDK_OP_GATED_RESIDUAL) load<GT, VEC, true>(pg + (j + k * G) * VEC, w[k]); // per sample
      if constexpr (OP == FUSEDK_OP_DIFFUSION_STEP) { // uncond and prev when given (uniform branches)
        if (p2) load<T, VEC>(p2 + (j + k * G) * VEC, w[k]);
        if (p3) load<T, VEC>(p3 + (j + k * G) * VEC, z[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < N; ++k) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        if constexpr (OP == FUSEDK_OP_DIFFUSION_STEP) v[k][i] = step_f32<KIND>(st, p2 != nullptr, p3 != nullptr, v[k][i], u[k][i], w[k][i], z[k][i]);
        else if constexpr (OP == FUSEDK_OP_SILU_FMA) v[k][i] = act_f32(fmaf(u[k][i], w[k][i], v[k][i]), FUSEDK_ACT_SILU);
        else if constexpr (OP == FUSEDK_OP_GATED_RESIDUAL) v[k][i] = fmaf(w[k][i], u[k][i], v[k][i]);
        else if constexpr (OP == FUSEDK_OP_GLU) v[k][i] = act_f32(v[k][i], KIND) * u[k][i];
        else v[k][i] = act_f32(v[k][i], KIND);
      }
      store_cs<T, VEC>(y + (j + k * G) * VEC, v[k]);
    }
  };
  const int64_t j = (int64_t)c * G * U + threadIdx.x;
  if (j + (U - 1) * G < nvec) {
    step(j, int_c<U>());
  } else {
#pragma unroll
    for (int k = 0; k < U; ++k)
      if (j + k * G < nvec) step(j + k * G, int_c<1>());
  }
}

// Vectors a thread (U) and the most threads a row (g_max, 128): one block moves a chunk of U * G
// vectors of a row and exits; the block scheduler balances the SMs (a capped grid-stride grid
// ends unevenly, and four vectors a thread hold registers that cost occupancy). act, one input,
// takes two vectors a thread (36 registers), the ops of two or more inputs one (bench/tune_ew.py
// sweeps them).
struct EwPlan {
  int g, rows_per_block;
  int64_t cpr; // chunks a row
};
constexpr int ew_vectors(int op) { return op == FUSEDK_OP_ACT ? 2 : 1; }

#ifdef FUSEDK_TUNING
// bench's sweeps set U and g_max through fusedk__tune_ew_plan (a measuring aid, not API: a
// process-wide setting, not thread safe); 0 keeps the library's choice.
int g_tune_ew[2] = {0, 0};
#endif

// The fewest chunks of at most g_max threads a row, then the fewest warps that cover a chunk
// (576 vectors at U = 2, g_max 256: two chunks of 160 threads, not 256 + 32); rows under 32 U
// vectors: a power-of-two group a row, 256 / G rows a block.
inline EwPlan plan_ew(int64_t nvec, int u, int g_max) {
  EwPlan p{1, 1, 1};
  const int64_t per = (nvec + u - 1) / u; // threads the row wants
  if (per < 32) {
    while (p.g < per) p.g *= 2;
    p.rows_per_block = 256 / p.g;
    return p;
  }
  const int64_t cpr = (per + g_max - 1) / g_max;
  p.g = (int)(((per + cpr - 1) / cpr + 31) / 32 * 32);
  p.cpr = cpr;
  p.rows_per_block = p.g <= 64 ? 128 / p.g : 1; // >= 2048 threads an SM under the 32-block limit
  return p;
}

template <typename T, int VEC, int OP, int KIND> cudaError_t launch_elementwise_vec(const fusedk__ew_args &a, cudaStream_t s) {
  const int64_t rows = a.B * a.L, nvec = a.D / VEC;
  int u = ew_vectors(OP), g_max = 128;
#ifdef FUSEDK_TUNING
  if (g_tune_ew[0] > 0) u = g_tune_ew[0];
  if (g_tune_ew[1] > 0) g_max = g_tune_ew[1];
#endif
  const EwPlan p = plan_ew(nvec, u, g_max);
  const int64_t grid = (rows + p.rows_per_block - 1) / p.rows_per_block * p.cpr;
  if (grid > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const dim3 block(p.g, p.rows_per_block);
  auto go = [&](auto u_c) {
    constexpr int U = decltype(u_c)::value;
    elementwise_rows_kernel<T, VEC, OP, KIND, U><<<(unsigned)grid, block, 0, s>>>(a, rows, (uint32_t)p.cpr);
    return cudaGetLastError();
  };
#ifdef FUSEDK_TUNING
  return dispatch_int<1, 2>(u, go);
#else
  return go(int_c<ew_vectors(OP)>());
#endif
}

// 16-byte vectors need every pointer 16-byte aligned and every row stride and D a multiple of the
// vector; otherwise the same kernel one element at a time.
template <typename T> cudaError_t launch_elementwise(const fusedk__ew_args &a0, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  // Where every tensor is compact and the op has no per-sample operand, the tensors are one row
  // of B * L * D elements: no per-row tail, and short rows (a video latent's 128) do not leave a
  // thread one vector a row.
  fusedk__ew_args a = a0;
  auto dense = [&](const fusedk__rows &r) { return !r.p || (r.sl == a.D && (a.B == 1 || r.sb == a.L * a.D)); };
  bool compact = a.op != FUSEDK_OP_GATED_RESIDUAL && dense(a.y);
  for (const fusedk__rows &r : a.in) compact = compact && dense(r);
  if (compact && a.B * a.L > 1) {
    a.D *= a.B * a.L, a.B = a.L = 1;
    for (fusedk__rows *r : {&a.y, &a.in[0], &a.in[1], &a.in[2], &a.in[3]})
      if (r->p) r->sb = 0, r->sl = a.D; // absent operands stay NULL rows (the kernel tests them)
  }
  bool vec = a.D % V == 0 && aligned16(a.y.p) && a.y.sb % V == 0 && a.y.sl % V == 0;
  for (const fusedk__rows &r : a.in)
    vec = vec && aligned16(r.p) && r.sb % V == 0 && r.sl % V == 0;
  auto go = [&](auto op, auto kind) {
    constexpr int OP = decltype(op)::value, KIND = decltype(kind)::value;
    return vec ? launch_elementwise_vec<T, V, OP, KIND>(a, s) : launch_elementwise_vec<T, 1, OP, KIND>(a, s);
  };
  switch (a.op) {
    case FUSEDK_OP_ACT:
      return dispatch_int<FUSEDK_ACT_RELU, FUSEDK_ACT_GELU, FUSEDK_ACT_GELU_TANH, FUSEDK_ACT_SILU>(
          a.kind, [&](auto kind) { return go(int_c<FUSEDK_OP_ACT>(), kind); });
    case FUSEDK_OP_GLU: // glu and glu_pair: act(in[0]) * in[1]
      return dispatch_int<FUSEDK_ACT_RELU, FUSEDK_ACT_GELU, FUSEDK_ACT_GELU_TANH, FUSEDK_ACT_SILU>(
          a.kind, [&](auto kind) { return go(int_c<FUSEDK_OP_GLU>(), kind); });
    case FUSEDK_OP_SILU_FMA: return go(int_c<FUSEDK_OP_SILU_FMA>(), int_c<0>());
    case FUSEDK_OP_GATED_RESIDUAL: // KIND 1: a float32 gate beside 16-bit rows
      if constexpr (sizeof(T) == 2)
        if (a.mod != a.scalar) return go(int_c<FUSEDK_OP_GATED_RESIDUAL>(), int_c<1>());
      return go(int_c<FUSEDK_OP_GATED_RESIDUAL>(), int_c<0>());
    case FUSEDK_OP_DIFFUSION_STEP:
      return dispatch_int<FUSEDK_SAMPLER_EULER, FUSEDK_SAMPLER_DDIM>(
          a.kind, [&](auto k) { return go(int_c<FUSEDK_OP_DIFFUSION_STEP>(), k); });
  }
  return cudaErrorInvalidValue;
}
#endif // FUSEDK__PART_ELEMENTWISE

#if FUSEDK__PART_POSITION
// ---------------------------------------------------------------------------------------------
// [position] rope (q and k in one launch), qk_norm_rope and the table builders.
//
// On Hopper both ops run qkv_tma_kernel (below) where its conditions hold (launch_tma). Else:
// rope_kernel: each thread owns one head (of q, then of k) and one unit of it, for every token: the rotating
// units (VEC/2 pairs of neighbours, INTERLEAVED; VEC elements and their partners R/2 further,
// HALF), then the pass-through vectors of channels >= R (copied only out of place). No index
// division; U tokens per step, all loads before the stores. q and k are read once and
// written once, streaming; the token's cos/sin row goes through the read-only path (re-read by
// every head).
// ---------------------------------------------------------------------------------------------

// N floats of a table row: one or two 8/16-byte loads when VECTOR (aligned), else N loads;
// NC: through the read-only path (global tables), else plain (a row staged in shared memory).
template <int N, bool VECTOR, bool NC = true> __device__ __forceinline__ void ld_table(const float *p, float (&out)[N]) {
  if constexpr (VECTOR && N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 f = NC ? __ldg(reinterpret_cast<const float4 *>(p + i)) : *reinterpret_cast<const float4 *>(p + i);
      out[i] = f.x, out[i + 1] = f.y, out[i + 2] = f.z, out[i + 3] = f.w;
    }
  } else if constexpr (VECTOR && N == 2) {
    const float2 f = NC ? __ldg(reinterpret_cast<const float2 *>(p)) : *reinterpret_cast<const float2 *>(p);
    out[0] = f.x, out[1] = f.y;
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = NC ? __ldg(p + i) : p[i];
  }
}

// N elements of T as floats: one 16-byte access when N == VEC > 1, else one element at a time.
template <typename T, int N, int VEC> __device__ __forceinline__ void ld_elems(const T *p, float (&out)[N]) {
  if constexpr (VEC > 1) {
    load<T, N>(p, out);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_f32<T>(p[i]);
  }
}
template <typename T, int N, int VEC> __device__ __forceinline__ void st_elems(T *p, const float (&in)[N]) {
  if constexpr (VEC > 1) {
    store_cs<T, N>(p, in);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = from_f32<T>(in[i]);
  }
}

// The rotation of a unit's PAIRS pairs: INTERLEAVED (x1[2i], x1[2i+1]); HALF (x1[i], x2[i]).
template <bool IL, int PAIRS, int E, int E2>
__device__ __forceinline__ void rotate(float (&x1)[E], float (&x2)[E2], const float (&co)[PAIRS], const float (&si)[PAIRS]) {
#pragma unroll
  for (int k = 0; k < PAIRS; ++k) {
    float &va = IL ? x1[2 * k] : x1[k];
    float &vb = IL ? x1[2 * k + 1] : x2[IL ? 0 : k];
    const float ra = fmaf(va, co[k], -vb * si[k]), rb = fmaf(vb, co[k], va * si[k]);
    va = ra, vb = rb;
  }
}

#ifndef FUSEDK__ROPE_U
#define FUSEDK__ROPE_U 2 // tokens a step (4 takes registers that cost more occupancy than they hide)
#endif
template <typename T, int VEC, int STYLE>
__global__ void __launch_bounds__(256) rope_kernel(const fusedk__rope_args a) {
  constexpr bool IL = STYLE == FUSEDK_ROPE_INTERLEAVED;
  constexpr int PAIRS = IL ? (VEC > 1 ? VEC / 2 : 1) : VEC; // pairs a unit rotates
  constexpr int E = IL ? 2 * PAIRS : PAIRS;                 // elements of each load
  const int half = (int)(a.R / 2), nrot = half / PAIRS, npass = (int)(a.Dh - a.R) / VEC;
  const int upr = nrot + npass, H0 = (int)a.t[0].H, Ht = H0 + (int)a.t[1].H;
  // this thread's head (q's, then k's) and units: fixed for every token, no division
  const int hh = blockIdx.y * blockDim.y + threadIdx.y;
  if (hh >= Ht) return;
  const int j = hh >= H0, h = hh - (j ? H0 : 0);
  const auto &t = a.t[j];
  const T *in_h = static_cast<const T *>(t.in) + h * t.sh;
  T *out_h = static_cast<T *>(t.out) + h * t.oh;
  const bool inplace = t.in == t.out;
  const float *cs_h = a.tab[0].p + h * a.tab[0].sh, *sn_h = a.tab[1].p + h * a.tab[1].sh;
  for (int64_t b = blockIdx.z; b < a.B; b += gridDim.z)
    for (int c = threadIdx.x; c < upr; c += blockDim.x) {
      const bool rot = c < nrot;
      if (!rot && inplace) continue; // pass-through channels are already in place
      const int64_t e = rot ? (IL ? (int64_t)c * E : (int64_t)c * PAIRS) : a.R + (int64_t)(c - nrot) * VEC;
      const T *in_c = in_h + b * t.sb + e;
      T *out_c = out_h + b * t.ob + e;
      const float *cs_c = cs_h + b * a.tab[0].sb + c * PAIRS, *sn_c = sn_h + b * a.tab[1].sb + c * PAIRS;
      // U tokens a step, every load before the first store (in place: each element's own load
      // precedes its store)
      constexpr int U = FUSEDK__ROPE_U;
      for (int64_t s0 = blockIdx.x; s0 < a.S; s0 += (int64_t)U * gridDim.x) {
        float x1[U][E], x2[U][IL ? 1 : E], co[U][PAIRS], si[U][PAIRS];
#pragma unroll
        for (int k = 0; k < U; ++k) {
          const int64_t s = s0 + (int64_t)k * gridDim.x;
          if (s >= a.S) continue;
          if (!rot) {
            ld_elems<T, VEC, VEC>(in_c + s * t.ss, reinterpret_cast<float(&)[VEC]>(x1[k]));
            continue;
          }
          ld_elems<T, E, VEC>(in_c + s * t.ss, x1[k]);
          if constexpr (!IL) ld_elems<T, E, VEC>(in_c + s * t.ss + half, x2[k]);
          ld_table<PAIRS, (VEC > 1)>(cs_c + s * a.tab[0].ss, co[k]);
          ld_table<PAIRS, (VEC > 1)>(sn_c + s * a.tab[1].ss, si[k]);
        }
#pragma unroll
        for (int k = 0; k < U; ++k) {
          const int64_t s = s0 + (int64_t)k * gridDim.x;
          if (s >= a.S) continue;
          T *o = out_c + s * t.os;
          if (!rot) {
            st_elems<T, VEC, VEC>(o, reinterpret_cast<float(&)[VEC]>(x1[k]));
            continue;
          }
          rotate<IL>(x1[k], x2[k], co[k], si[k]);
          st_elems<T, E, VEC>(o, x1[k]);
          if constexpr (!IL) st_elems<T, E, VEC>(o + half, x2[k]);
        }
      }
    }
}

// The element width of rope's and qk_norm_rope's loads: 16-byte vectors (16 / sizeof(T)) when
// Dh, R and (HALF) R/2 are whole vectors, every pointer and stride of q, k, v, their outputs and
// weights 16-byte aligned and the tables 16-byte aligned with strides in whole float4s; else 1.
// *pairs: the pairs a unit rotates at that width.
template <typename T> int rope_width(const fusedk__rope_args &a, int *pairs) {
  constexpr int V = 16 / sizeof(T);
  bool vec = a.Dh % V == 0 && a.R % (a.style == FUSEDK_ROPE_HALF ? 2 * V : V) == 0;
  for (const auto &t : a.t)
    vec = vec && aligned16(t.in) && aligned16(t.out) && aligned16(t.w) && t.sb % V == 0 && t.ss % V == 0 &&
          t.sh % V == 0 && t.ob % V == 0 && t.os % V == 0 && t.oh % V == 0;
  for (const auto &t : a.tab) vec = vec && aligned16(t.p) && t.sb % 4 == 0 && t.ss % 4 == 0 && t.sh % 4 == 0;
  const int v = vec ? V : 1;
  *pairs = a.style == FUSEDK_ROPE_INTERLEAVED ? (v > 1 ? v / 2 : 1) : v;
  return v;
}

// Launch shape: X threads (a power of two >= a head's units, <= 32) per head, 256 / X heads a
// block; grid (tokens, head groups, B), each block walking U tokens a step over an even share
// of the S positions; ~8 blocks per SM in all.
template <typename T> cudaError_t launch_rope(const fusedk__rope_args &a, cudaStream_t s, int device) {
  constexpr int V = 16 / sizeof(T);
  int pairs;
  const int v = rope_width<T>(a, &pairs);
  const bool vec = v > 1;
  const int64_t upr = a.R / 2 / pairs + (a.Dh - a.R) / v, Ht = a.t[0].H + a.t[1].H;
  int X = 1;
  while (X < upr && X < 32) X *= 2;
  const dim3 block(X, 256 / X);
  const int64_t gy = (Ht + block.y - 1) / block.y, gz = a.B < 65535 ? a.B : 65535;
  const int64_t cap = (int64_t)device_sms(device) * 8, gx0 = std::max<int64_t>(1, cap / (gy * gz));
  constexpr int U = FUSEDK__ROPE_U;
  const int64_t steps = (a.S + U * gx0 - 1) / (U * gx0), gx = std::min<int64_t>((a.S + U * steps - 1) / (U * steps), 2147483647);
  if (gy > 65535) return cudaErrorInvalidConfiguration; // > 16M heads
  const dim3 grid((unsigned)gx, (unsigned)gy, (unsigned)gz);
  return dispatch_int<FUSEDK_ROPE_INTERLEAVED, FUSEDK_ROPE_HALF>(a.style, [&](auto style) {
    constexpr int ST = decltype(style)::value;
    if (vec) rope_kernel<T, V, ST><<<grid, block, 0, s>>>(a);
    else rope_kernel<T, 1, ST><<<grid, block, 0, s>>>(a);
    return cudaGetLastError();
  });
}

using RopeTensor = std::remove_reference_t<decltype(fusedk__rope_args::t[0])>; // q, k or v

// One item's elements folded by f (from 0), in order: a pass-through vector's VEC elements (kind
// 2), or a rotating unit's (kind 1: x1, and x2 for HALF). item_sq: the sum of squares (both
// qk_norm_rope kernels), item_amax: the largest magnitude (qk_norm_rope_int8).
template <bool IL, int VEC, int E, int E2, typename F>
__device__ __forceinline__ float item_fold(int kind, const float (&x1)[E], const float (&x2)[E2], F &&f) {
  float r = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (kind == 1 || e < VEC) r = f(r, x1[e]);
  if constexpr (!IL)
    if (kind == 1)
#pragma unroll
      for (int e = 0; e < E; ++e) r = f(r, x2[e]);
  return r;
}
template <bool IL, int VEC, int E, int E2>
__device__ __forceinline__ float item_sq(int kind, const float (&x1)[E], const float (&x2)[E2]) {
  return item_fold<IL, VEC>(kind, x1, x2, [](float r, float x) { return fmaf(x, x, r); });
}
template <bool IL, int VEC, int E, int E2>
__device__ __forceinline__ float item_amax(int kind, const float (&x1)[E], const float (&x2)[E2]) {
  return item_fold<IL, VEC>(kind, x1, x2, [](float r, float x) { return amax_nan(r, x); });
}

// N values quantized (i8_of) into int8 at p: one N-byte store where VEC > 1 (p then N-aligned:
// rope_width), else a byte each.
template <int N, int VEC> __device__ __forceinline__ void st_q8(int8_t *p, const float *x, float inv) {
  if constexpr (VEC > 1) {
    uint64_t bytes = 0;
#pragma unroll
    for (int k = 0; k < N; ++k) bytes |= (uint64_t)(i8_of(x[k], inv) & 255) << 8 * k;
    if constexpr (N == 8) *reinterpret_cast<uint64_t *>(p) = bytes;
    else if constexpr (N == 4) *reinterpret_cast<uint32_t *>(p) = (uint32_t)bytes;
    else if constexpr (N == 2) *reinterpret_cast<uint16_t *>(p) = (uint16_t)bytes;
    else *p = (int8_t)bytes;
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) p[k] = (int8_t)i8_of(x[k], inv);
  }
}

// One item's math in both qk_norm_rope kernels: the weight (weigh, when normed), then
// 1/rms (rs): a pass-through vector (kind 2) is scaled, a rotating unit (kind 1) gets rs inside
// its cos/sin (2 x PAIRS multiplies, not one an element) and is rotated by the token's table row
// (table fills co, si).
template <bool IL, int VEC, int PAIRS, int E, int E2, typename W, typename Tab>
__device__ __forceinline__ void item_math(int kind, bool normed, float rs, float (&x1)[E], float (&x2)[E2], W &&weigh,
                                          Tab &&table) {
  if (normed) weigh();
  if (kind == 2) {
    if (normed)
#pragma unroll
      for (int e = 0; e < VEC; ++e) x1[e] *= rs;
    return;
  }
  float co[PAIRS], si[PAIRS];
  table(co, si);
  if (normed)
#pragma unroll
    for (int k = 0; k < PAIRS; ++k) co[k] *= rs, si[k] *= rs;
  rotate<IL>(x1, x2, co, si);
}

// One item's end in qkv_kernel: item_math with the weight and the token's table row read from
// global memory, and (store) a streaming store into the output's layout. kind 1: rotating unit c;
// 2: pass-through vector c - nrot.
template <typename T, int VEC, int STYLE, int E, int E2>
__device__ __forceinline__ void qk_item_out(const fusedk__rope_args &a, const RopeTensor &t,
                                            int kind, float (&x1)[E], float (&x2)[E2], int norm, float sq,
                                            float inv_n, int c, int nrot, int half, int r0, int64_t b, int64_t s,
                                            int h, bool store = true) {
  constexpr bool IL = STYLE == FUSEDK_ROPE_INTERLEAVED;
  constexpr int PAIRS = IL ? (VEC > 1 ? VEC / 2 : 1) : VEC;
  T *o = static_cast<T *>(t.out) + b * t.ob + s * t.os + h * t.oh;
  const bool normed = norm != FUSEDK_QK_NORM_NONE;
  const float rs = normed ? rsqrtf(fmaf(sq, inv_n, a.eps)) : 1.f;
  const T *w = static_cast<const T *>(t.w);
  const T *wh = w ? w + (norm == FUSEDK_QK_NORM_FULL ? h * a.Dh : 0) : nullptr;
  const int e = kind == 2 ? r0 + (c - nrot) * VEC : IL ? c * E : c * PAIRS;
  auto weigh = [&] {
    if (!wh) return;
    if (kind == 2) {
      float wv[VEC];
      ld_elems<T, VEC, VEC>(wh + e, wv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) x1[k] *= wv[k];
      return;
    }
    float w1[E], w2[E2];
    ld_elems<T, E, VEC>(wh + e, w1);
    if constexpr (!IL) ld_elems<T, E, VEC>(wh + e + half, w2);
#pragma unroll
    for (int k = 0; k < E; ++k) {
      x1[k] *= w1[k];
      if constexpr (!IL) x2[k] *= w2[k];
    }
  };
  auto table = [&](float(&co)[PAIRS], float(&si)[PAIRS]) {
    ld_table<PAIRS, (VEC > 1)>(a.tab[0].p + b * a.tab[0].sb + s * a.tab[0].ss + h * a.tab[0].sh + c * PAIRS, co);
    ld_table<PAIRS, (VEC > 1)>(a.tab[1].p + b * a.tab[1].sb + s * a.tab[1].ss + h * a.tab[1].sh + c * PAIRS, si);
  };
  item_math<IL, VEC, PAIRS>(kind, normed, rs, x1, x2, weigh, table);
  if (!store) return; // qk_norm_rope_int8: qk_q8_out stores
  if (kind == 2) {
    st_elems<T, VEC, VEC>(o + e, reinterpret_cast<float(&)[VEC]>(x1));
    return;
  }
  st_elems<T, E, VEC>(o + e, x1);
  if constexpr (!IL) st_elems<T, E, VEC>(o + e + half, x2);
}

// One item's int8 store in qkv_kernel (qk_norm_rope_int8): x1 (and x2) quantized by its head's
// amax (i8_of) at the item's place in the output head; the head's first item writes the scale.
template <int VEC, int STYLE, int E, int E2>
__device__ __forceinline__ void qk_q8_out(const RopeTensor &t, int kind, const float (&x1)[E], const float (&x2)[E2],
                                          float amax, int c, int nrot, int half, int r0, int64_t b, int64_t s, int h) {
  constexpr bool IL = STYLE == FUSEDK_ROPE_INTERLEAVED;
  constexpr int PAIRS = IL ? (VEC > 1 ? VEC / 2 : 1) : VEC;
  int8_t *o = static_cast<int8_t *>(t.out) + b * t.ob + s * t.os + h * t.oh;
  const int e = kind == 2 ? r0 + (c - nrot) * VEC : IL ? c * E : c * PAIRS;
  const float inv = q_inv<127>(amax);
  if (kind == 2) {
    st_q8<VEC, VEC>(o + e, x1, inv);
  } else {
    st_q8<E, VEC>(o + e, x1, inv);
    if constexpr (!IL) st_q8<E, VEC>(o + e + half, x2, inv);
  }
  if (c == 0) t.sc[b * t.cb + s * t.cs + h * t.ch] = amax / 127.f;
}

// qk_norm_rope's kernel (rope keeps its per-head one). Block row blockIdx.y takes one tensor
// (q, k, v) and walks its tokens, U a step: a token's row is its H heads (a chunk of them when they
// exceed the block), each head cut in items: the rotating units above and the pass-through
// vectors (v: all pass-through). Item i of a chunk is thread i % NT's (i / NT)-th of M. A step
// issues every load of its U rows first (the memory-level parallelism), then the sums of
// squares: a head whose items are a power of two <= 32 lanes sums by shuffles alone; a full row
// (FULL) or an odd head sums through shared-memory atomics and one barrier (a triple buffer, so
// zeroing the next buffer needs no second barrier). Then the weight, the rotation and streaming
// stores through the output strides (the layout). Reads and writes each element once.
// Q8 (qk_norm_rope_int8, q and k): the items' largest magnitudes then reduce over each head as
// the sums do (shuffles where a head's items are a power of two <= 32 lanes, else shared-memory
// atomics on the bits and a barrier, in buffers after the sums'), and the items go out as int8.
// Items stay float32 in registers and the tables are read per head: packed 16-bit items and a
// head-less table read once a token take more registers than they save.
template <typename T, int VEC, int STYLE, int U, int M, bool Q8>
__global__ void __launch_bounds__(512) qkv_kernel(const __grid_constant__ fusedk__rope_args a) {
  constexpr bool IL = STYLE == FUSEDK_ROPE_INTERLEAVED;
  constexpr int PAIRS = IL ? (VEC > 1 ? VEC / 2 : 1) : VEC; // pairs a unit rotates
  constexpr int E = IL ? 2 * PAIRS : PAIRS;                 // elements of each load (>= VEC)
  extern __shared__ float red[];                            // [3][U][slots] sums of squares
  const int j = blockIdx.y;
  const auto &t = a.t[j];
  const bool rot = j < 2;
  const int norm = rot ? a.norm : FUSEDK_QK_NORM_NONE, NT = blockDim.x;
  const int half = rot ? (int)(a.R / 2) : 0, r0 = rot ? (int)a.R : 0, H = (int)t.H;
  const int nrot = half / PAIRS, iph = nrot + ((int)a.Dh - r0) / VEC;
  const int hpc = norm == FUSEDK_QK_NORM_FULL ? H : min(H, NT * M / iph); // heads a chunk
  const bool pow2 = iph <= 32 && (iph & (iph - 1)) == 0, lanes = norm == FUSEDK_QK_NORM_HEAD && pow2;
  const bool atomics = norm != FUSEDK_QK_NORM_NONE && !lanes, q8 = Q8 && rot;
  const int slots = norm == FUSEDK_QK_NORM_FULL ? 1 : hpc, slots8 = q8 && !pow2 ? hpc : 0;
  const bool skip_pass = !q8 && norm == FUSEDK_QK_NORM_NONE && t.in == t.out; // in place: already there
  const float inv_n = 1.f / (float)(norm == FUSEDK_QK_NORM_FULL ? (int64_t)H * a.Dh : a.Dh);
  const int used = atomics ? slots : 0;                               // the sums' slots
  unsigned *red8 = reinterpret_cast<unsigned *>(red + 3 * U * used); // [3][U][slots8] amax bits
  if (atomics || slots8) {
    for (int i = threadIdx.x; i < 3 * U * (used + slots8); i += NT) red[i] = 0.f;
    __syncthreads();
  }
  int phase = 0, phase8 = 0;
  for (int64_t b = blockIdx.z; b < a.B; b += gridDim.z)
    for (int64_t s0 = blockIdx.x; s0 < a.S; s0 += (int64_t)U * gridDim.x)
      for (int h0 = 0; h0 < H; h0 += hpc) {
        const int n = min(hpc, H - h0) * iph;
        float x1[U][M][E], x2[U][M][IL ? 1 : E], sq[U][M];
        int kind[U][M]; // 0: no item, 1: rotating, 2: pass-through
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int m = 0; m < M; ++m) {
            const int i = threadIdx.x + m * NT, hl = i / iph, c = i - hl * iph;
            const int64_t s = s0 + (int64_t)u * gridDim.x;
            kind[u][m] = i >= n || s >= a.S ? 0 : c < nrot ? 1 : skip_pass ? 0 : 2;
            sq[u][m] = 0.f;
            const T *p = static_cast<const T *>(t.in) + b * t.sb + s * t.ss + (h0 + hl) * t.sh;
            if (kind[u][m] == 1) {
              const int e = IL ? c * E : c * PAIRS;
              ld_elems<T, E, VEC>(p + e, x1[u][m]);
              if constexpr (!IL) ld_elems<T, E, VEC>(p + e + half, x2[u][m]);
            } else if (kind[u][m] == 2) {
              ld_elems<T, VEC, VEC>(p + r0 + (c - nrot) * VEC, reinterpret_cast<float(&)[VEC]>(x1[u][m]));
            }
          }
        if (norm != FUSEDK_QK_NORM_NONE) {
#pragma unroll
          for (int u = 0; u < U; ++u)
#pragma unroll
            for (int m = 0; m < M; ++m)
              if (kind[u][m]) sq[u][m] = item_sq<IL, VEC>(kind[u][m], x1[u][m], x2[u][m]);
          if (lanes) {
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
              for (int m = 0; m < M; ++m) sq[u][m] = lanes_sum(sq[u][m], iph);
          } else {
            float *r = red + phase * U * slots;
#pragma unroll
            for (int u = 0; u < U; ++u) {
              if (norm == FUSEDK_QK_NORM_FULL) {
                float v = 0.f;
#pragma unroll
                for (int m = 0; m < M; ++m) v += sq[u][m];
                v = lanes_sum(v, 32);
                if ((threadIdx.x & 31) == 0) atomicAdd(r + u, v);
              } else {
#pragma unroll
                for (int m = 0; m < M; ++m)
                  if (kind[u][m]) atomicAdd(r + u * slots + (threadIdx.x + m * NT) / iph, sq[u][m]);
              }
            }
            __syncthreads();
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
              for (int m = 0; m < M; ++m)
                if (kind[u][m]) sq[u][m] = r[u * slots + (norm == FUSEDK_QK_NORM_FULL ? 0 : (threadIdx.x + m * NT) / iph)];
            // the buffer of two steps on: its readers (the step before) all passed this barrier
            float *z = red + (phase == 0 ? 2 : phase - 1) * U * slots;
            for (int i = threadIdx.x; i < U * slots; i += NT) z[i] = 0.f;
            phase = phase == 2 ? 0 : phase + 1;
          }
        }
        float am[U][M]; // q8: the item's, then its head's largest magnitude
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int m = 0; m < M; ++m) {
            am[u][m] = 0.f;
            if (kind[u][m] == 0) continue;
            const int i = threadIdx.x + m * NT, hl = i / iph, c = i - hl * iph, h = h0 + hl;
            const int64_t s = s0 + (int64_t)u * gridDim.x;
            qk_item_out<T, VEC, STYLE>(a, t, kind[u][m], x1[u][m], x2[u][m], norm, sq[u][m], inv_n, c, nrot, half, r0, b, s,
                                       h, !q8);
            if (q8) am[u][m] = item_amax<IL, VEC>(kind[u][m], x1[u][m], x2[u][m]);
          }
        if constexpr (Q8) {
          if (!q8) continue;
          if (pow2) {
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
              for (int m = 0; m < M; ++m) am[u][m] = lanes_amax(am[u][m], iph);
          } else {
            unsigned *r = red8 + phase8 * U * slots8;
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
              for (int m = 0; m < M; ++m)
                if (kind[u][m]) atomicMax(r + u * slots8 + (threadIdx.x + m * NT) / iph, __float_as_uint(am[u][m]));
            __syncthreads();
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
              for (int m = 0; m < M; ++m)
                if (kind[u][m]) am[u][m] = __uint_as_float(r[u * slots8 + (threadIdx.x + m * NT) / iph]);
            unsigned *z = red8 + (phase8 == 0 ? 2 : phase8 - 1) * U * slots8; // as the sums' buffers
            for (int i = threadIdx.x; i < U * slots8; i += NT) z[i] = 0u;
            phase8 = phase8 == 2 ? 0 : phase8 + 1;
          }
#pragma unroll
          for (int u = 0; u < U; ++u)
#pragma unroll
            for (int m = 0; m < M; ++m) {
              if (kind[u][m] == 0) continue;
              const int i = threadIdx.x + m * NT, hl = i / iph, c = i - hl * iph;
              qk_q8_out<VEC, STYLE>(t, kind[u][m], x1[u][m], x2[u][m], am[u][m], c, nrot, half, r0, b,
                                    s0 + (int64_t)u * gridDim.x, h0 + hl);
            }
        }
      }
}

// The Hopper form of both ops (launch_tma below picks it). A row is one tensor (q, k or v) of
// one token whose H heads are contiguous (H * Dh elements); a block takes kTmaRows rows of one
// tensor, consecutive tokens. Lanes of warp 0 copy them all at once into shared memory, a stage
// a row with its token's cos and sin rows (q, k), as bulk copies side by side, each row's landing
// counted by an mbarrier: the loads in flight cost no registers. A thread's items (M, as
// qkv_kernel's) are the same in every row of its block, so their offsets and weights are read
// once; a row costs shared-memory reads, the sums of squares (HEAD: over a head's lanes; FULL:
// the row, one barrier), the scaling, the rotation and 16-byte streaming stores into the output
// layout. Short blocks, not one persistent block an SM's share, so the hardware keeps every SM
// busy to the end. Q8 (qk_norm_rope_int8): the items' largest magnitudes reduce over the head's
// lanes, and the items go out as int8 with the head's scale (qkv_kernel's qk_q8_out).
constexpr int kTmaRows = 4;
struct TmaPlan {
  int ny, stage_bytes;               // tensors, bytes a stage (a row and its tables)
  int tab_off, tab_floats, tab_head; // a stage's cos row at tab_off bytes, sin tab_floats on; a head's offset in them
};

template <typename T, int STYLE, int M, bool Q8>
__global__ void __maxnreg__(M == 1 ? (STYLE == FUSEDK_ROPE_INTERLEAVED ? 56 : 64) : 128)
qkv_tma_kernel(const __grid_constant__ fusedk__rope_args a, const TmaPlan p) {
#ifdef FUSEDK__SM90
  constexpr int VEC = 16 / sizeof(T);
  constexpr bool IL = STYLE == FUSEDK_ROPE_INTERLEAVED;
  constexpr int PAIRS = IL ? VEC / 2 : VEC, E2 = IL ? 1 : VEC; // a unit: VEC/2 neighbour pairs, or VEC and partners
  extern __shared__ __align__(128) unsigned char stage[];
  __shared__ uint64_t full[kTmaRows]; // a row's copies landed
  __shared__ float warp_sq[2][16];    // FULL: a warp's sum, by row parity
  const int tid = threadIdx.x, NT = blockDim.x, j = (int)(blockIdx.x % p.ny);
  const auto &t = a.t[j];
  const bool rot = j < 2;
  const int norm = rot ? a.norm : FUSEDK_QK_NORM_NONE, Dh = (int)a.Dh;
  const int half = rot ? (int)(a.R / 2) : 0, r0 = rot ? (int)a.R : 0, nrot = half / PAIRS;
  const int iph = nrot + (Dh - r0) / VEC, n = (int)t.H * iph;
  const bool skip_pass = !Q8 && norm == FUSEDK_QK_NORM_NONE && t.in == t.out; // in place: already there
  const float inv_n = 1.f / (float)(norm == FUSEDK_QK_NORM_FULL ? t.H * a.Dh : a.Dh);
  const uint32_t row_bytes = (uint32_t)(t.H * a.Dh * (int64_t)sizeof(T)), tab_bytes = rot ? p.tab_floats * 4 : 0;
  const int64_t tok0 = (int64_t)(blockIdx.x / p.ny) * kTmaRows;
  const int rows = (int)min((int64_t)kTmaRows, a.B * a.S - tok0);
  if (tid < 32) { // lane 3r + k copies row r's data (k 0, arriving with every byte expected), cos (1), sin (2)
    const int per = rot ? 3 : 1, r = tid / per, k = tid - r * per;
    if (tid < rows) mbar_init(&full[tid], 1);
    fence_mbar_init();
    __syncwarp();
    if (r < rows) {
      const int64_t b = (tok0 + r) / a.S, s = tok0 + r - b * a.S;
      const char *src = k ? reinterpret_cast<const char *>(a.tab[k - 1].p + b * a.tab[k - 1].sb + s * a.tab[k - 1].ss)
                          : reinterpret_cast<const char *>(static_cast<const T *>(t.in) + b * t.sb + s * t.ss);
      if (k == 0) mbar_expect(&full[r], row_bytes + 2 * tab_bytes); // (a copy may land first: the arrival is pending)
      bulk_copy(stage + r * p.stage_bytes + (k ? p.tab_off + (k - 1) * tab_bytes : 0), src, k ? tab_bytes : row_bytes,
                &full[r]);
    }
  }
  // this thread's items, the same in every row: kind (0 none, 1 rotating, 2 pass-through), the
  // offsets in the staged row, its table rows and the output row; the weights as loaded
  int kind[M], xo[M], to[M];
  int64_t oo[M];
  Raw<T, VEC> w1[M], w2[M];
  const T *w = static_cast<const T *>(t.w);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int i = tid + m * NT, hl = i / iph, c = i - hl * iph;
    kind[m] = i >= n ? 0 : c < nrot ? 1 : skip_pass ? 0 : 2;
    const int e = c < nrot ? (IL ? c * VEC : c * PAIRS) : r0 + (c - nrot) * VEC;
    xo[m] = hl * Dh + e, oo[m] = hl * t.oh + e, to[m] = hl * p.tab_head + c * PAIRS;
    if (w && kind[m] && norm != FUSEDK_QK_NORM_NONE) {
      const T *wh = w + (norm == FUSEDK_QK_NORM_FULL ? hl * a.Dh : 0) + e;
      w1[m] = ld<T, VEC, true>(wh);
      if (!IL && kind[m] == 1) w2[m] = ld<T, VEC, true>(wh + half); // (IL: w2 unused)
    }
  }
  __syncthreads(); // the barriers' init before any wait
  int64_t b = tok0 / a.S, s = tok0 - b * a.S;
  for (int r = 0; r < rows; ++r) {
    const int odd = r & 1;
    const unsigned char *d = stage + r * p.stage_bytes;
    const T *row = reinterpret_cast<const T *>(d);
    const float *cs = reinterpret_cast<const float *>(d + p.tab_off), *sn = cs + p.tab_floats;
    mbar_wait(&full[r], 0);
    float x1[M][VEC], x2[M][E2], sq[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      sq[m] = 0.f;
      if (!kind[m]) continue;
      load<T, VEC>(row + xo[m], x1[m]);
      if constexpr (!IL)
        if (kind[m] == 1) load<T, VEC>(row + xo[m] + half, x2[m]);
      if (norm != FUSEDK_QK_NORM_NONE) sq[m] = item_sq<IL, VEC>(kind[m], x1[m], x2[m]);
    }
    if (norm == FUSEDK_QK_NORM_HEAD) { // a head's items: iph (a power of two <= 32) aligned lanes
#pragma unroll
      for (int m = 0; m < M; ++m) sq[m] = lanes_sum(sq[m], iph);
    } else if (norm == FUSEDK_QK_NORM_FULL) {
      float v = 0.f;
#pragma unroll
      for (int m = 0; m < M; ++m) v += sq[m];
      v = lanes_sum(v, 32);
      // a buffer is rewritten two rows on, after every warp has passed the next row's barrier,
      // so after it read this one
      if ((tid & 31) == 0) warp_sq[odd][tid / 32] = v;
      __syncthreads();
      v = 0.f;
      for (int k = 0; k < NT / 32; ++k) v += warp_sq[odd][k];
#pragma unroll
      for (int m = 0; m < M; ++m) sq[m] = v;
    }
    T *out = static_cast<T *>(t.out) + b * t.ob + s * t.os;
    float am[M]; // Q8: the item's, then its head's largest magnitude
#pragma unroll
    for (int m = 0; m < M; ++m) {
      am[m] = 0.f;
      if (!kind[m]) continue;
      const bool normed = norm != FUSEDK_QK_NORM_NONE;
      auto weigh = [&] {
        if (!w) return;
        float wv[VEC];
        to_floats<T, VEC>(w1[m], wv);
#pragma unroll
        for (int e = 0; e < VEC; ++e) x1[m][e] *= wv[e];
        if constexpr (!IL)
          if (kind[m] == 1) {
            to_floats<T, VEC>(w2[m], wv);
#pragma unroll
            for (int e = 0; e < VEC; ++e) x2[m][e] *= wv[e];
          }
      };
      auto table = [&](float(&co)[PAIRS], float(&si)[PAIRS]) {
        ld_table<PAIRS, true, false>(cs + to[m], co), ld_table<PAIRS, true, false>(sn + to[m], si);
      };
      item_math<IL, VEC, PAIRS>(kind[m], normed, normed ? rsqrtf(fmaf(sq[m], inv_n, a.eps)) : 1.f, x1[m], x2[m], weigh,
                                table);
      if constexpr (Q8) {
        am[m] = item_amax<IL, VEC>(kind[m], x1[m], x2[m]);
        continue;
      }
      store_cs<T, VEC>(out + oo[m], x1[m]);
      if constexpr (!IL)
        if (kind[m] == 1) store_cs<T, VEC>(out + oo[m] + half, x2[m]);
    }
    if constexpr (Q8) { // a head's items: iph (a power of two <= 32: launch_tma) aligned lanes
#pragma unroll
      for (int m = 0; m < M; ++m) {
        am[m] = lanes_amax(am[m], iph);
        if (!kind[m]) continue;
        const int i = tid + m * NT, hl = i / iph;
        qk_q8_out<VEC, STYLE>(t, kind[m], x1[m], x2[m], am[m], i - hl * iph, nrot, half, r0, b, s, hl);
      }
    }
    if (++s == a.S) s = 0, ++b;
  }
#endif
}

template <auto kernel>
cudaError_t run_tma_as(const fusedk__rope_args &a, const TmaPlan &p, int NT, cudaStream_t s, int device, bool *used) {
  constexpr size_t fixed = kTmaRows * sizeof(uint64_t) + 2 * 16 * sizeof(float); // barriers, warp sums
  const size_t smem = (size_t)kTmaRows * p.stage_bytes;
  const int64_t blocks = (a.B * a.S + kTmaRows - 1) / kTmaRows * p.ny;
  if (!tma_code<kernel>(device) || smem + fixed > device_smem_optin(device) || blocks > 2147483647) return cudaSuccess;
  const cudaError_t e = smem_opt_in<kernel>(smem, fixed, device);
  if (e != cudaSuccess) return e;
  kernel<<<(unsigned)blocks, NT, smem, s>>>(a, p);
  *used = true;
  return cudaGetLastError();
}
template <typename T, int ST, int M>
cudaError_t run_tma(const fusedk__rope_args &a, const TmaPlan &p, int NT, cudaStream_t s, int device, bool *used) {
  if (a.q8) return run_tma_as<qkv_tma_kernel<T, ST, M, true>>(a, p, NT, s, device, used);
  return run_tma_as<qkv_tma_kernel<T, ST, M, false>>(a, p, NT, s, device, used);
}

// The Hopper path when it applies: 16-byte vectors (rope_width), each tensor's heads contiguous
// (one bulk copy a row), tables whose token slice is one run of whole 16 bytes (a head-less row,
// or every head's row back to back), HEAD norms (and q8's heads) over a power-of-two <= 32 items
// a head (shuffle sums and maxima), rows of <= 2048 items (M <= 4 a thread of <= 512; HALF <=
// 1024). *used = false: not taken, nothing launched.
template <typename T>
cudaError_t launch_tma(const fusedk__rope_args &a, cudaStream_t s, int device, bool *used) {
  constexpr int V = 16 / sizeof(T);
  *used = false;
  int pairs;
  if (tma_disabled() || rope_width<T>(a, &pairs) != V) return cudaSuccess;
  int ny = 0;
  int64_t items = 0, bytes = 0;
  for (; ny < 3 && a.t[ny].in; ++ny) {
    const auto &t = a.t[ny];
    if (t.H > 1 && t.sh != a.Dh) return cudaSuccess;
    const int64_t iph = ny < 2 ? a.R / 2 / pairs + (a.Dh - a.R) / V : a.Dh / V;
    if (ny < 2 && (a.norm == FUSEDK_QK_NORM_HEAD || a.q8) && (iph > 32 || (iph & (iph - 1)))) return cudaSuccess;
    items = std::max(items, t.H * iph);
    bytes = std::max(bytes, t.H * a.Dh * (int64_t)sizeof(T));
  }
  const int64_t half = a.R / 2, H = a.t[0].H;
  int64_t head = -1; // floats from one head's table row to the next in the slice
  for (const auto &tb : a.tab) {
    const int64_t th = tb.sh == 0 || H == 1 ? 0 : tb.sh == half ? half : -1;
    if (th < 0 || (head >= 0 && th != head)) return cudaSuccess;
    head = th;
  }
  const int64_t tab_floats = head ? H * half : half, tab_off = (bytes + 15) / 16 * 16;
  const int64_t stage = (tab_off + 2 * 4 * tab_floats + 127) / 128 * 128;
  if (items > 2048 || tab_floats % 4 || stage > (1 << 20)) return cudaSuccess;
  const int m = items <= 512 ? 1 : items <= 1024 ? 2 : 4;
  const int NT = (int)std::max<int64_t>(32, ((items + m - 1) / m + 31) / 32 * 32);
  const TmaPlan p{ny, (int)stage, (int)tab_off, (int)tab_floats, (int)head};
  return dispatch_int<FUSEDK_ROPE_INTERLEAVED, FUSEDK_ROPE_HALF>(a.style, [&](auto style) {
    constexpr int ST = decltype(style)::value;
    switch (m) {
      case 1: return run_tma<T, ST, 1>(a, p, NT, s, device, used);
      case 2: return run_tma<T, ST, 2>(a, p, NT, s, device, used);
      default: // (HALF at M = 4 would spill: the other kernels take those rows)
        if constexpr (ST == FUSEDK_ROPE_HALF) return cudaSuccess;
        else return run_tma<T, ST, 4>(a, p, NT, s, device, used);
    }
  });
}

struct QkvLaunch {
  dim3 grid;
  int NT;
  size_t smem;
  cudaStream_t s;
  int device;
};
template <auto kernel, int U> cudaError_t run_qkv_as(const fusedk__rope_args &a, QkvLaunch L) {
  const cudaError_t e = smem_opt_in<kernel>(L.smem, 0, L.device); // (q8's amax slots past 48 KB)
  if (e != cudaSuccess) return e;
  const int64_t ny = L.grid.y, gz = L.grid.z;
  const int64_t blocks = (int64_t)device_sms(L.device) * resident_blocks<kernel>(L.device, L.NT, L.smem);
  const int64_t gx0 = std::max<int64_t>(1, blocks / (ny * gz)), steps = (a.S + U * gx0 - 1) / (U * gx0);
  L.grid.x = (unsigned)std::min<int64_t>((a.S + U * steps - 1) / (U * steps), 2147483647);
  kernel<<<L.grid, L.NT, L.smem, L.s>>>(a);
  return cudaGetLastError();
}
template <typename T, int VEC, int ST, int U, int M> cudaError_t run_qkv(const fusedk__rope_args &a, QkvLaunch L) {
  if (a.q8) return run_qkv_as<qkv_kernel<T, VEC, ST, U, M, true>, U>(a, L);
  return run_qkv_as<qkv_kernel<T, VEC, ST, U, M, false>, U>(a, L);
}

// Launch shape (the width: rope_width): the largest row in M items a thread of NT <= 512 threads (a multiple of 32);
// U = 2 tokens a step when M = 1. Rows beyond NT * M items go in chunks of heads (FULL never:
// fusedk.h caps its rows). Grid (tokens, tensors, B), one wave of resident blocks.
template <typename T> cudaError_t launch_qkv(const fusedk__rope_args &a, cudaStream_t s, int device) {
  constexpr int V = 16 / sizeof(T);
  int pairs;
  const int v = rope_width<T>(a, &pairs);
  const bool vec = v > 1;
  int ny = 0;
  int64_t items = 0, iph[3] = {0, 0, 0};
  for (; ny < 3 && a.t[ny].in; ++ny) {
    iph[ny] = ny < 2 ? a.R / 2 / pairs + (a.Dh - a.R) / v : a.Dh / v;
    items = std::max(items, a.t[ny].H * iph[ny]);
  }
  const int mmax = vec ? 4 : 16; // a full row fits (fusedk.h: H * Dh <= 8192), and any head
  int m = 1;
  while (m < mmax && (items + m - 1) / m > 512) m *= 2;
  const int NT = (int)std::min<int64_t>(512, ((items + m - 1) / m + 31) / 32 * 32), U = m == 1 ? 2 : 1;
  const bool full = a.norm == FUSEDK_QK_NORM_FULL;
  // shared sums: FULL one a row; HEAD one a head of the chunk unless its items sum by shuffles;
  // q8: one amax a head of the chunk unless its items reduce by shuffles
  int64_t slots = 0, slots8 = 0;
  for (int j = 0; j < ny && j < 2; ++j) {
    if ((int64_t)NT * m < (full ? a.t[j].H * iph[j] : iph[j])) return cudaErrorInvalidConfiguration;
    const bool pow2 = iph[j] <= 32 && (iph[j] & (iph[j] - 1)) == 0;
    const int64_t hpc = full ? a.t[j].H : std::min<int64_t>(a.t[j].H, (int64_t)NT * m / iph[j]);
    if (full) slots = 1;
    else if (a.norm == FUSEDK_QK_NORM_HEAD && !pow2) slots = std::max(slots, hpc);
    if (a.q8 && !pow2) slots8 = std::max(slots8, hpc);
  }
  const QkvLaunch L{dim3(1, (unsigned)ny, (unsigned)std::min<int64_t>(a.B, 65535)), NT,
                    (size_t)(3 * U * (slots + slots8)) * sizeof(float), s, device};
  return dispatch_int<FUSEDK_ROPE_INTERLEAVED, FUSEDK_ROPE_HALF>(a.style, [&](auto style) {
    constexpr int ST = decltype(style)::value;
    if (vec) {
      switch (m) {
        case 1: return run_qkv<T, V, ST, 2, 1>(a, L);
        case 2: return run_qkv<T, V, ST, 1, 2>(a, L);
        default: return run_qkv<T, V, ST, 1, 4>(a, L);
      }
    }
    switch (m) {
      case 1: return run_qkv<T, 1, ST, 2, 1>(a, L);
      case 2: return run_qkv<T, 1, ST, 1, 2>(a, L);
      case 4: return run_qkv<T, 1, ST, 1, 4>(a, L);
      case 8: return run_qkv<T, 1, ST, 1, 8>(a, L);
      default: return run_qkv<T, 1, ST, 1, 16>(a, L);
    }
  });
}

// The tables: one thread per entry, the angle in float64 (fusedk.h's formula), one rounding.
__global__ void __launch_bounds__(256) rope_table_kernel(const fusedk__table_args a) {
  const int64_t n = a.S * a.H * a.F;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t f = i % a.F, h = (i / a.F) % a.H, s = i / (a.F * a.H);
    double sn, cs;
    sincos(fusedk__table_angle(&a, s, h, f), &sn, &cs);
    a.out[0][s * a.os[0] + h * a.oh[0] + f] = (float)cs;
    a.out[1][s * a.os[1] + h * a.oh[1] + f] = (float)sn;
  }
}
#endif // FUSEDK__PART_POSITION

#if FUSEDK__PART_LINEAR
// ---------------------------------------------------------------------------------------------
// [gemm] cuBLASLt GEMMs for any family: plans (descriptors and the algorithm, chosen by the
// heuristic and timed on a large GEMM's first call) cached by shape, dtype, epilogue, leading
// dims, alignment and device; a workspace and a growing scratch a (device, stream); one lock.
// A family's entry point takes the lock through gemm_locked, gets its stream's workspace (and
// scratch) from lt_arena and runs each GEMM, described column-major as cuBLASLt sees it (LtGemm),
// through lt_matmul; ran = false means cuBLASLt has no algorithm and the family takes its own
// route. Families that call it compile in the linear part (one LtState a process).
// ---------------------------------------------------------------------------------------------

constexpr size_t kLtWorkspace = 32u << 20; // cuBLASLt's workspace a (device, stream), Hopper's suggestion
constexpr int kLtPlans = 256;              // cached plans (a bounded table: the oldest slot goes)
constexpr int kLtArenas = StreamBuffers::kMax; // (device, stream) pairs with a workspace
constexpr int kLtCandidates = 8;           // heuristic algorithms timed on a large GEMM's first call
constexpr int kLtWide = 8192;              // at most, with FUSEDK_LINEAR_TUNE=2 or 3 (lt_widen)
constexpr double kLtTuneFlops = 1e10;      // large: 2 m n k over this (a few ms of tuning, once)

// FUSEDK_LINEAR_TUNE, read when a plan is made: 0 = the heuristic's first algorithm; 1 (the
// default) = its first kLtCandidates, timed on a large GEMM's first call; 2 = also each tile those
// (and the plain GEMM's) candidates use, in every custom option and cluster shape cuBLASLt accepts
// for this GEMM (H100: ~100 algorithms, 0.05-1 s once a plan); 3 = every tile so (H100: ~4400,
// 3-40 s once a plan). bench/lt_search.cu measured what each level finds.
int lt_tune_level() {
  const char *e = getenv("FUSEDK_LINEAR_TUNE");
  return e && *e >= '0' && *e <= '3' && !e[1] ? *e - '0' : 1;
}

// One GEMM D = op(A) op(B) (column-major, cuBLASLt's terms) with an epilogue.
struct LtGemm {
  cublasOperation_t ta, tb;
  int64_t m, n, k;
  const void *a, *b;
  int64_t lda, ldb;
  void *d;
  int64_t ldd;
  cublasLtEpilogue_t epi;
  const void *bias;
  void *aux;
  int64_t ldaux;
  bool d32;            // D in float32 (the exact route), else the inputs' type
  int32_t scalar, tf32; // the inputs' fusedk_scalar; float32 through TF32 tensor cores
  bool acc;            // D += op(A) op(B) (beta 1, C = D): never timed, as timing rewrites D
  int32_t dscalar = -1; // D's (and the bias's) fusedk_scalar where it is not the inputs' (FP8)
  const float *ascale = nullptr, *bscale = nullptr; // FP8: A's scale a row of op(A), B's a column of op(B)
  int32_t fast = 0;     // FP8: the tensor cores' own accumulation over all of K (CUBLASLT_MATMUL_DESC_FAST_ACCUM)
};

// What a plan depends on: shapes, leading dims, dtype, epilogue, TF32, device and the alignment
// of every pointer (the heuristic picks kernels by it: an algorithm found for aligned pointers
// returns NOT_SUPPORTED on misaligned ones).
struct LtKey {
  int64_t m, n, k, lda, ldb, ldd, ldaux;
  int32_t dev, scalar, tf32, epi, ta, tb, d32, acc, dscalar, fast;
  uint32_t align;
  bool operator==(const LtKey &o) const { return !memcmp(this, &o, sizeof *this); }
};

struct LtPlan {
  LtKey key;
  bool used, found; // found = 0: the heuristic had no algorithm (cached too)
  bool tuned;       // the candidates were timed (or there is nothing to time)
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulAlgo_t algo;
  std::vector<cublasLtMatmulAlgo_t> cand; // until tuned
};

// a (device, stream)'s cuBLASLt workspace and scratch (nullptr when the call asks none)
struct LtArena {
  void *ws, *scratch;
};

// Every cached cuBLASLt object, behind one lock: plans are shared, and a plan's pointer
// attributes are set just before its matmul. Host cost of a cached call: the lock, a hash probe,
// two attribute sets and cublasLtMatmul.
struct LtState {
  std::mutex mu;
  cublasLtHandle_t handle[kMaxDevices] = {};
  LtPlan plans[kLtPlans] = {};
  int next_victim = 0;
  StreamBuffers ws, scratch; // kLtWorkspace bytes, and the largest scratch asked, a (device, stream)
  StreamBuffers cat;         // linear_lowrank's [x | h], the largest asked, a (device, stream)
};
LtState &lt_state() {
  static LtState *s = new LtState; // never destroyed: no teardown order at exit
  return *s;
}

uint32_t log2_align(const void *p) {
  const uintptr_t u = (uintptr_t)p;
  uint32_t a = 0;
  while (a < 8 && !(u & (((uintptr_t)1 << (a + 1)) - 1))) ++a; // up to 256 bytes
  return u ? a : 8;
}

cudaDataType_t lt_type(int scalar) {
  return scalar == FUSEDK_F32 ? CUDA_R_32F : scalar == FUSEDK_F16 ? CUDA_R_16F
         : scalar == FUSEDK_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
}

void lt_destroy(LtPlan &p) {
  if (!p.used) return;
  if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  if (p.la) cublasLtMatrixLayoutDestroy(p.la);
  if (p.lb) cublasLtMatrixLayoutDestroy(p.lb);
  if (p.ld) cublasLtMatrixLayoutDestroy(p.ld);
  p = LtPlan{};
}

// Appends the heuristic's first n answers for p's descriptors to p.cand. No algorithm is an
// answer (the caller falls back), not an error.
cublasStatus_t lt_heuristic(LtPlan &p, cublasLtHandle_t h, cublasLtMatmulPreference_t pref, int n) {
  cublasLtMatmulHeuristicResult_t r[kLtCandidates] = {};
  int got = 0;
  const cublasStatus_t q = cublasLtMatmulAlgoGetHeuristic(h, p.desc, p.la, p.lb, p.ld, p.ld, pref, n, r, &got);
  if (q != CUBLAS_STATUS_SUCCESS && q != CUBLAS_STATUS_NOT_SUPPORTED && q != CUBLAS_STATUS_INVALID_VALUE) return q;
  for (int i = 0; i < got; ++i)
    if (r[i].state == CUBLAS_STATUS_SUCCESS) p.cand.push_back(r[i].algo);
  return CUBLAS_STATUS_SUCCESS;
}

// Tuning levels 2 and 3: the heuristic offers few of the algorithms cuBLASLt has for an epilogue
// (Hopper: 8 of ~4400 tile x custom option x cluster configurations it accepts), and its picks
// with an epilogue fall behind the plain GEMM where other configurations do not
// (bench/lt_search.cu). Level 2: every (algorithm, tile, stages) the heuristic
// proposes for this GEMM, with its epilogue and without; level 3: each such (algorithm, stages)
// with every tile. Each in every custom option and five cluster shapes (auto, 1x1, 2x1, 1x2, 2x2)
// that cublasLtMatmulAlgoCheck accepts within the workspace; CTA swizzle, inner shape and split-K
// at their defaults (the heuristic's own candidates as it chose them); at most kLtWide.
cublasStatus_t lt_widen(LtPlan &p, cublasLtHandle_t h, cublasLtMatmulPreference_t pref, cublasComputeType_t ct,
                        cudaDataType_t t, cudaDataType_t dt, cublasLtEpilogue_t epi, bool all_tiles) {
  std::vector<cublasLtMatmulAlgo_t> seeds = p.cand;
  if (epi != CUBLASLT_EPILOGUE_DEFAULT) { // the plain GEMM's tiles too (none if that query fails)
    const cublasLtEpilogue_t none = CUBLASLT_EPILOGUE_DEFAULT;
    std::swap(seeds, p.cand);
    if (!cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &none, sizeof none))
      lt_heuristic(p, h, pref, kLtCandidates);
    // the plan's own epilogue back: the one error that matters (the plan would be wrong)
    const cublasStatus_t b = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    std::swap(seeds, p.cand);
    if (b) return b;
  }
  struct Shape { int32_t id; uint32_t tile, stages; };
  std::vector<Shape> shapes;
  for (const cublasLtMatmulAlgo_t &a : seeds) {
    Shape c{};
    size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &c.id, sizeof c.id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &c.tile, sizeof c.tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c.stages, sizeof c.stages, &w);
    for (uint32_t tile = all_tiles ? 1 : c.tile; tile <= (all_tiles ? CUBLASLT_MATMUL_TILE_END - 1 : c.tile); ++tile) {
      bool seen = false;
      for (const Shape &o : shapes) seen |= o.id == c.id && o.tile == tile && o.stages == c.stages;
      if (!seen) shapes.push_back(Shape{c.id, tile, c.stages});
    }
  }
  const uint16_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                               CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1};
  for (const Shape &c : shapes) {
    cublasLtMatmulAlgo_t a;
    if (cublasLtMatmulAlgoInit(h, ct, CUDA_R_32F, t, t, dt, dt, c.id, &a)) continue;
    int32_t options = 0;
    size_t w;
    cublasLtMatmulAlgoCapGetAttribute(&a, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &options, sizeof options, &w);
    for (uint32_t o = 0; o <= (uint32_t)std::min(options, 15); ++o)
      for (uint16_t cl : clusters) {
        if ((int)p.cand.size() >= kLtWide) return CUBLAS_STATUS_SUCCESS;
        if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &c.tile, sizeof c.tile) ||
            cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c.stages, sizeof c.stages) ||
            cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &o, sizeof o) ||
            cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cl, sizeof cl))
          continue;
        cublasLtMatmulHeuristicResult_t r{};
        if (cublasLtMatmulAlgoCheck(h, p.desc, p.la, p.lb, p.ld, p.ld, &a, &r) || r.workspaceSize > kLtWorkspace) continue;
        bool seen = false;
        for (const cublasLtMatmulAlgo_t &o2 : p.cand) seen |= !memcmp(&o2, &a, sizeof a);
        if (!seen) p.cand.push_back(a);
      }
  }
  return CUBLAS_STATUS_SUCCESS;
}

// The plan of key k (lock held): cached, or made: descriptors, layouts, one heuristic query.
cublasStatus_t lt_plan(LtState &st, const LtKey &k, const LtGemm &g, cublasLtHandle_t h, LtPlan **out) {
  uint64_t hash = 1469598103934665603ull;
  const unsigned char *b = reinterpret_cast<const unsigned char *>(&k);
  for (size_t i = 0; i < sizeof k; ++i) hash = (hash ^ b[i]) * 1099511628211ull;
  LtPlan *slot = nullptr;
  for (int i = 0; i < 8; ++i) { // a short probe; a full neighbourhood evicts round-robin
    LtPlan &p = st.plans[(hash + i) % kLtPlans];
    if (p.used && p.key == k) { *out = &p; return CUBLAS_STATUS_SUCCESS; }
    if (!p.used && !slot) slot = &p;
  }
  if (!slot) {
    slot = &st.plans[(hash + st.next_victim) % kLtPlans];
    st.next_victim = (st.next_victim + 1) % 8;
    lt_destroy(*slot);
  }
  LtPlan p{};
  p.key = k, p.used = true;
  const cudaDataType_t t = lt_type(k.scalar), dt = k.d32 ? CUDA_R_32F : lt_type(k.dscalar);
  const cublasComputeType_t ct = k.scalar == FUSEDK_F32 && k.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cublasOperation_t ta = (cublasOperation_t)k.ta, tb = (cublasOperation_t)k.tb;
  const cublasLtEpilogue_t epi = (cublasLtEpilogue_t)k.epi;
  cublasStatus_t s = cublasLtMatmulDescCreate(&p.desc, ct, CUDA_R_32F);
  if (!s) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  if (!s) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  if (!s) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
  if (!s && k.ldaux) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &k.ldaux, sizeof k.ldaux);
  if (!s && k.scalar == FUSEDK_E4M3) { // a scale vector each (per output channel, per row), set before the query
    const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    const int8_t fast = (int8_t)k.fast;
    s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer, sizeof outer);
    if (!s) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer, sizeof outer);
    if (!s) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.ascale, sizeof g.ascale);
    if (!s) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.bscale, sizeof g.bscale);
    if (!s) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast);
    if (!s && g.bias) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &dt, sizeof dt);
    if (!s && g.bias) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias);
  }
  // A is k x m (transposed) or m x k, B k x n or n x k, D m x n
  if (!s) s = cublasLtMatrixLayoutCreate(&p.la, t, ta == CUBLAS_OP_N ? k.m : k.k, ta == CUBLAS_OP_N ? k.k : k.m, k.lda);
  if (!s) s = cublasLtMatrixLayoutCreate(&p.lb, t, tb == CUBLAS_OP_N ? k.k : k.n, tb == CUBLAS_OP_N ? k.n : k.k, k.ldb);
  if (!s) s = cublasLtMatrixLayoutCreate(&p.ld, dt, k.m, k.n, k.ldd);
  cublasLtMatmulPreference_t pref = nullptr;
  if (!s) s = cublasLtMatmulPreferenceCreate(&pref);
  const uint64_t ws = kLtWorkspace;
  if (!s) s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  const cublasLtMatmulPreferenceAttributes_t al[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  // split-K partial sums only in float32 (COMPUTE_TYPE): the in-place and output-type schemes
  // round them to bf16/f16 (seen on the H100: bf16 N = 4095, K = 1000 off by several ulps)
  const uint32_t red = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  if (!s) s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red, sizeof red);
  for (int i = 0; i < 4 && !s; ++i) {
    const uint32_t bytes = 1u << ((k.align >> (4 * (i < 2 ? i : 2))) & 15u); // C is D
    s = cublasLtMatmulPreferenceSetAttribute(pref, al[i], &bytes, sizeof bytes);
  }
  // a large GEMM keeps the heuristic's first candidates, timed on its first call (lt_tune); FP8's
  // heuristic offers one algorithm for scale vectors: level 2 at least widens it to its tiles,
  // custom options and cluster shapes
  const int level = k.scalar == FUSEDK_E4M3 && lt_tune_level() == 1 ? 2 : lt_tune_level();
  const bool large = level && !k.acc && 2.0 * (double)k.m * (double)k.n * (double)k.k >= kLtTuneFlops;
  if (!s) s = lt_heuristic(p, h, pref, large ? kLtCandidates : 1);
  for (int retry = 0; retry < 2 && !s && p.cand.empty() && k.scalar == FUSEDK_E4M3; ++retry) {
    // none: without the alignment preferences, then without the reduction mask too (split-K sums
    // in the output type: what the probe's heuristic query, which finds one, allows)
    cublasLtMatmulPreferenceDestroy(pref);
    pref = nullptr;
    s = cublasLtMatmulPreferenceCreate(&pref);
    if (!s) s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (!s && !retry) s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red, sizeof red);
    if (!s) s = lt_heuristic(p, h, pref, large ? kLtCandidates : 1);
  }
  if (!s && large && level >= 2 && !p.cand.empty())
    s = lt_widen(p, h, pref, ct, t, dt, epi, level == 3);
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  p.found = !p.cand.empty();
  p.tuned = p.cand.size() < 2 || k.acc;
  if (p.found) p.algo = p.cand[0];
  if (p.tuned) p.cand = {};
  *slot = std::move(p);
  if (s) lt_destroy(*slot);
  *out = slot;
  return s;
}

// The (device, stream) arena: its workspace made on first use, its scratch grown to `scratch`
// bytes (StreamBuffers; too many streams: cudaErrorLaunchOutOfResources, reported as such).
cudaError_t lt_arena(LtState &st, int dev, cudaStream_t s, size_t scratch, LtArena *out) {
  *out = LtArena{nullptr, nullptr};
  cudaError_t e = st.ws.get(dev, s, kLtWorkspace, 0, &out->ws);
  if (e == cudaSuccess && scratch) e = st.scratch.get(dev, s, scratch, 0, &out->scratch);
  return e;
}

fusedk_status lt_fail(cublasStatus_t s, const char *op, const char *what) {
  return fusedk__fail(s == CUBLAS_STATUS_ALLOC_FAILED ? FUSEDK_ERR_OUT_OF_MEMORY : FUSEDK_ERR_CUBLAS,
                      "%s: cuBLASLt %s failed: %s (%s)", op, what, cublasLtGetStatusName(s), cublasLtGetStatusString(s));
}

// The fastest of a large plan's candidates, timed on this call's own buffers (the output is
// written; the call then writes it again), once per plan: each candidate once untimed (its first
// launch loads its module: lazy loading) and once between events; then the best 16, and of those
// the best 3, again in three rotated rounds, as a single timing drifts with the clock under GEMM
// load. The heuristic's first choice is not the fastest everywhere. Not while the stream is
// being captured (events cannot be waited on): the plan keeps its first candidate until an
// uncaptured call.
void lt_tune(LtPlan &p, cublasLtHandle_t h, const LtGemm &g, void *ws, cudaStream_t s) {
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    return;
  }
  cudaEvent_t ev[2];
  if (cudaEventCreate(&ev[0]) != cudaSuccess) { cudaGetLastError(); return; }
  if (cudaEventCreate(&ev[1]) != cudaSuccess) { cudaEventDestroy(ev[0]); cudaGetLastError(); return; }
  const float one = 1.f, zero = 0.f;
  // ms of `runs` back-to-back launches of candidate i after `warm` untimed ones; < 0: it failed
  auto time = [&](size_t i, int warm, int runs) {
    cublasStatus_t c = CUBLAS_STATUS_SUCCESS;
    for (int r = 0; r < warm + runs && !c; ++r) {
      if (r == warm) cudaEventRecord(ev[0], s);
      c = cublasLtMatmul(h, p.desc, &one, g.a, p.la, g.b, p.lb, &zero, g.d, p.ld, g.d, p.ld, &p.cand[i], ws,
                         kLtWorkspace, s);
    }
    cudaEventRecord(ev[1], s);
    float ms = 0.f;
    if (cudaEventSynchronize(ev[1]) != cudaSuccess || cudaEventElapsedTime(&ms, ev[0], ev[1]) != cudaSuccess) {
      cudaGetLastError();
      return -1.f;
    }
    return c ? -1.f : ms;
  };
  std::vector<std::pair<float, size_t>> t;
  for (size_t i = 0; i < p.cand.size(); ++i) {
    const float ms = time(i, 1, 1);
    if (ms >= 0.f) t.emplace_back(ms, i);
  }
  for (size_t keep : {(size_t)16, (size_t)3}) { // the best again, in rotated rounds
    std::sort(t.begin(), t.end());
    t.resize(std::min(keep, t.size()));
    for (auto &x : t) x.first = 0.f;
    for (size_t round = 0; round < 3 && t.size() > 1; ++round)
      for (size_t j = 0; j < t.size(); ++j) {
        auto &x = t[(j + round) % t.size()];
        const float ms = time(x.second, 0, 2);
        x.first += ms >= 0.f ? ms : 1e30f;
      }
  }
  std::sort(t.begin(), t.end());
  cudaEventDestroy(ev[0]);
  cudaEventDestroy(ev[1]);
  if (!t.empty()) p.algo = p.cand[t[0].second];
  p.cand = {};
  p.tuned = true;
}

// Runs g through its cached plan (lock held). *ran = false: cuBLASLt has no algorithm for it
// (nothing launched; the caller falls back).
fusedk_status lt_matmul(LtState &st, const LtGemm &g, int dev, cudaStream_t s, void *ws, const char *op, bool *ran) {
  *ran = false;
  cublasLtHandle_t &h = st.handle[dev];
  if (!h) {
    const cublasStatus_t c = cublasLtCreate(&h);
    if (c) { h = nullptr; return lt_fail(c, op, "cublasLtCreate"); }
  }
  LtKey k;
  memset(&k, 0, sizeof k); // the key is compared as bytes: padding zeroed
  k.m = g.m, k.n = g.n, k.k = g.k, k.lda = g.lda, k.ldb = g.ldb, k.ldd = g.ldd, k.ldaux = g.aux ? g.ldaux : 0;
  k.dev = dev, k.scalar = g.scalar, k.tf32 = g.tf32, k.epi = (int32_t)g.epi, k.ta = (int32_t)g.ta, k.tb = (int32_t)g.tb;
  k.d32 = g.d32, k.acc = g.acc, k.dscalar = g.dscalar < 0 ? g.scalar : g.dscalar, k.fast = g.fast;
  k.align = log2_align(g.a) | log2_align(g.b) << 4 | log2_align(g.d) << 8 | (g.bias ? log2_align(g.bias) : 0) << 12 |
            (g.aux ? log2_align(g.aux) : 0) << 16 | (g.ascale ? log2_align(g.ascale) : 0) << 20 |
            (g.bscale ? log2_align(g.bscale) : 0) << 24;
  LtPlan *p;
  cublasStatus_t c = lt_plan(st, k, g, h, &p);
  if (c) return lt_fail(c, op, "plan");
  if (!p->found) return FUSEDK_OK;
  if (g.bias) c = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias);
  if (!c && g.ascale) c = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.ascale, sizeof g.ascale);
  if (!c && g.bscale) c = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.bscale, sizeof g.bscale);
  if (!c && g.aux) c = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux);
  const float one = 1.f, zero = 0.f;
  if (!c && !p->tuned) lt_tune(*p, h, g, ws, s);
  if (!c) c = cublasLtMatmul(h, p->desc, &one, g.a, p->la, g.b, p->lb, g.acc ? &one : &zero, g.d, p->ld, g.d, p->ld,
                             &p->algo, ws, kLtWorkspace, s);
  // refused at run time (H100: INVALID_VALUE for some unaligned shapes the heuristic had an
  // algorithm for): remembered, and the caller takes its exact route
  if (c == CUBLAS_STATUS_NOT_SUPPORTED || c == CUBLAS_STATUS_INVALID_VALUE) {
    p->found = false;
    return FUSEDK_OK;
  }
  if (c) return lt_fail(c, op, "matmul");
  *ran = true;
  return FUSEDK_OK;
}

fusedk_status arena_fail(cudaError_t e, const char *op) {
  return e == cudaErrorLaunchOutOfResources
             ? fusedk__fail(FUSEDK_ERR_UNSUPPORTED, "%s: more than %d (device, stream) pairs ran fusedk's GEMMs (linear ops); "
                            "fusedk_shutdown() releases their workspaces", op, kLtArenas)
             : cuda_fail(e, op, "allocating the cuBLASLt workspace or scratch");
}

// 16-byte aligned rows: what cuBLASLt's 16-bit outputs need to be exact (its kernels for unaligned
// rows were several bf16 ulps off on the H100: at N = 4095, K = 1000 and at K = 4095)
template <typename T> bool rows16(const void *p, int64_t ld) { return aligned16(p) && ld % (16 / (int64_t)sizeof(T)) == 0; }

// fn(state) on device dev with the state's lock held: how a family's entry point reaches the
// layer (handles and arenas are per device; plans are shared and their pointer attributes are set
// just before each matmul, hence one lock).
template <typename F> fusedk_status gemm_locked(int32_t dev, const char *op, F &&fn) {
  if (dev < 0 || dev >= kMaxDevices)
    return fusedk__fail(FUSEDK_ERR_DEVICE, "%s: CUDA device %d, expected 0..%d", op, (int)dev, kMaxDevices - 1);
  return on_device(dev, op, [&] {
    LtState &st = lt_state();
    std::lock_guard<std::mutex> lock(st.mu);
    return fn(st);
  });
}

// Frees every plan, handle, workspace and scratch (fusedk_shutdown: no GEMM in flight).
void gemm_shutdown() {
  LtState &st = lt_state();
  std::lock_guard<std::mutex> lock(st.mu);
  for (LtPlan &p : st.plans) lt_destroy(p);
  st.ws.release(), st.scratch.release(), st.cat.release();
  for (int d = 0; d < kMaxDevices; ++d)
    if (st.handle[d]) cublasLtDestroy(st.handle[d]), st.handle[d] = nullptr;
  st.next_victim = 0;
  cudaGetLastError(); // e.g. at process exit: not sticky
}

// ---------------------------------------------------------------------------------------------
// [linear] linear and linear_backward: cuBLASLt GEMMs (bias and RELU/GELU_TANH in its epilogue),
// fusedk's passes where it has none: an act pass (GELU erf, SILU), a bias pass (fallback), the
// backward's dz = dy * act'(aux) with deterministic column sums for db.
//
// Row-major y[M, N] = x[M, K] w[N, K]^T is, column-major, y^T[N, M] = w[K, N]^T x^T[K, M]: w is
// cuBLASLt's A (transposed), x its B, and the bias runs along D's rows (N) as its epilogue wants.
// From other families: the activations (act_f32, [numerics]) and the act pass, which is the act
// op itself (fusedk__cuda_elementwise, [elementwise]'s entry point).
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ float act_grad_f32(float z, int kind) {
  switch (kind) {
    case FUSEDK_ACT_GELU: return 0.5f * (1.f + erff(z * 0.70710678118654752f)) + z * 0.39894228040143268f * expf(-0.5f * z * z);
    case FUSEDK_ACT_GELU_TANH: {
      const float c = 0.79788456080286536f, t = tanhf(c * fmaf(0.044715f * z, z * z, z));
      return fmaf(0.5f, 1.f + t, 0.5f * z * (1.f - t * t) * c * fmaf(3.f * 0.044715f * z, z, 1.f));
    }
    case FUSEDK_ACT_SILU: {
      const float sg = __frcp_rn(1.f + expf(-z));
      return sg * fmaf(z, 1.f - sg, 1.f);
    }
    case FUSEDK_ACT_RELU: return z > 0.f ? 1.f : 0.f;
    default: return 1.f;
  }
}

// z = src (+ bias[n]) (src NULL: 0), aux = z, y = act(z); GELU (erf) and SILU see z rounded to T.
// The exact route: src is a float32 GEMM result (rows cuBLASLt's epilogues are not used on, K = 0,
// and the backward's unaligned outputs). One element a thread (not a hot path).
template <typename T, typename S, int ACT>
__global__ void linear_bias_act_kernel(fusedk__mat y, fusedk__mat aux, fusedk__mat src, const T *bias, int64_t M, int64_t N) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < M * N; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t m = i / N, n = i - m * N;
    float z = src.p ? to_f32<S>(static_cast<const S *>(src.p)[m * src.ld + n]) : 0.f;
    if (bias) z += to_f32<T>(bias[n]);
    if (aux.p) static_cast<T *>(aux.p)[m * aux.ld + n] = from_f32<T>(z);
    if (ACT == FUSEDK_ACT_GELU || ACT == FUSEDK_ACT_SILU) z = round_to<T>(z);
    static_cast<T *>(y.p)[m * y.ld + n] = from_f32<T>(act_f32(z, ACT));
  }
}

// dz[m, n] = dy * act'(aux) rounded to T (written when dz.p), and per chunk of rows the column
// sums of dz (of dy for NONE) into part[chunk][n] when part: a block is 32 x 8 threads over
// 32 * VEC columns and the rows of its chunk; its 8 row lanes meet in shared memory. The sums
// run in a fixed order (no atomics): db is bitwise the same run to run.
template <typename T, int VEC, int ACT>
__global__ void __launch_bounds__(256) linear_dz_kernel(fusedk__mat dz, fusedk__mat dy, fusedk__mat aux, float *part,
                                                        int64_t M, int64_t N, int64_t rows_per_chunk) {
  __shared__ float sums[8][32 * VEC];
  const int64_t n0 = ((int64_t)blockIdx.x * 32 + threadIdx.x) * VEC;
  const int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk, r1 = min(M, r0 + rows_per_chunk);
  float acc[VEC] = {};
  if (n0 < N)
    for (int64_t m = r0 + threadIdx.y; m < r1; m += 8) {
      float g[VEC], z[VEC];
      load<T, VEC>(static_cast<const T *>(dy.p) + m * dy.ld + n0, g);
      if constexpr (ACT != FUSEDK_ACT_NONE) {
        load<T, VEC>(static_cast<const T *>(aux.p) + m * aux.ld + n0, z);
#pragma unroll
        for (int i = 0; i < VEC; ++i) g[i] = g[i] * act_grad_f32(z[i], ACT);
        round_all<T, VEC>(g);
        if (dz.p) store_cs<T, VEC>(static_cast<T *>(dz.p) + m * dz.ld + n0, g);
      }
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[i] += g[i];
    }
  if (!part) return; // uniform across the block
#pragma unroll
  for (int i = 0; i < VEC; ++i) sums[threadIdx.y][threadIdx.x * VEC + i] = acc[i];
  __syncthreads();
  for (int c = threadIdx.y * 32 + threadIdx.x; c < 32 * VEC; c += 256) {
    const int64_t n = (int64_t)blockIdx.x * 32 * VEC + c;
    if (n >= N) continue;
    float s = 0.f;
#pragma unroll
    for (int r = 0; r < 8; ++r) s += sums[r][c];
    part[(int64_t)blockIdx.y * N + n] = s;
  }
}

// db[n] = the chunks' sums in chunk order, rounded once
template <typename T> __global__ void linear_db_kernel(T *db, const float *part, int64_t chunks, int64_t N) {
  const int64_t n = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (n >= N) return;
  float s = 0.f;
  for (int64_t c = 0; c < chunks; ++c) s += part[c * N + n];
  db[n] = from_f32<T>(s);
}

// y[rows, cols] = act(src + bias) (aux = src + bias): src of T, or float32 (src32), or none (0)
template <typename T> cudaError_t launch_bias_act(fusedk__mat y, fusedk__mat aux, fusedk__mat src, bool src32,
                                                  const void *bias, int act, int64_t rows, int64_t cols,
                                                  cudaStream_t s, int dev) {
  const int64_t n = rows * cols, grid = std::min<int64_t>((n + 255) / 256, (int64_t)device_sms(dev) * 8);
  return dispatch_int<FUSEDK_ACT_NONE, FUSEDK_ACT_RELU, FUSEDK_ACT_GELU, FUSEDK_ACT_GELU_TANH, FUSEDK_ACT_SILU>(
      act, [&](auto act_c) {
        constexpr int A = decltype(act_c)::value;
        if (src32)
          linear_bias_act_kernel<T, float, A><<<(unsigned)grid, 256, 0, s>>>(y, aux, src, static_cast<const T *>(bias), rows, cols);
        else
          linear_bias_act_kernel<T, T, A><<<(unsigned)grid, 256, 0, s>>>(y, aux, src, static_cast<const T *>(bias), rows, cols);
        return cudaGetLastError();
      });
}

// y = act(z) in place over the rows of z (GELU erf, SILU, RELU with aux): the act op's kernel,
// through the elementwise part's entry point (its own object where the build compiles parts)
fusedk_status act_pass(const fusedk__linear_args &a, fusedk__mat z, int dev, cudaStream_t s, const char *op) {
  fusedk__ew_args e{};
  e.op = FUSEDK_OP_ACT, e.scalar = a.scalar, e.kind = a.act;
  e.B = 1, e.L = a.M, e.D = a.N;
  e.y = fusedk__rows{a.y.p, 0, a.y.ld};
  e.in[0] = fusedk__rows{z.p, 0, z.ld};
  return fusedk__cuda_elementwise(&e, op, dev, s);
}

// FP8 rows (quantize_fp8, dequantize_fp8, linear_fp8's exact route; quantize_int8 the same with
// int8 data, 127.5 for 448): a warp a row, 16-byte loads
// of the 16-bit or float32 side and 8- or 4-byte accesses of the e4m3 side (VEC elements); a
// quantized row is read twice (its amax, then its values: the second read hits L1/L2), so DRAM
// sees one read and one write. The conversions: cvt.rn.satfinite to e4m3 (NaN to 0x7f), e4m3 to
// f16 exactly; x * (448 / amax) and data * scale as single float32 products (fusedk.h's
// reference computes the same). ACT >= 0 (glu_fp8): the row quantized is act(x) * x2, made as the
// glu kernel makes it, from the act half x and the other half x2 of the row.

// VEC values of the row a quantizer reads, at element d: x's, or glu_fp8's act(x) * x2
template <typename T, int VEC, int ACT>
__device__ __forceinline__ void quant_src(const T *x, const T *x2, int64_t d, float (&v)[VEC]) {
  load<T, VEC>(x + d, v);
  if constexpr (ACT >= 0) {
    float u[VEC];
    load<T, VEC>(x2 + d, u);
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[i] = act_f32(v[i], ACT) * u[i];
  }
}

template <typename T, int VEC, bool DEQ, int ACT>
__global__ void __launch_bounds__(256) quant_kernel(const fusedk__quant_args a) {
  const int64_t row = (int64_t)blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (row >= a.B * a.L) return;
  const int64_t b = row / a.L, l = row - b * a.L;
  T *x = static_cast<T *>(a.x.p) + b * a.x.sb + l * a.x.sl;
  const T *x2 = ACT >= 0 ? static_cast<const T *>(a.x2.p) + b * a.x2.sb + l * a.x2.sl : nullptr;
  uint8_t *q = static_cast<uint8_t *>(a.q.p) + b * a.q.sb + l * a.q.sl;
  float *sc = static_cast<float *>(a.qs.p) + b * a.qs.sb + l * a.qs.sl;
  if constexpr (DEQ) {
    const float k = *sc;
    for (int64_t d = lane * VEC; d < a.D; d += 32 * VEC) {
      const Bytes<VEC> r = ld_bytes<VEC>(q + d);
      float v[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] = __fmul_rn(f32_of_e4m3(r.b[i]), k);
      store_cs<T, VEC>(x + d, v);
    }
    return;
  }
  float m = 0.f;
  for (int64_t d = lane * VEC; d < a.D; d += 32 * VEC) {
    float v[VEC];
    quant_src<T, VEC, ACT>(x, x2, d, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) m = amax_nan(m, v[i]);
  }
  m = lanes_amax(m, 32);
  const float inv = q8_inv(m, a.i8);
  for (int64_t d = lane * VEC; d < a.D; d += 32 * VEC) {
    float v[VEC];
    quant_src<T, VEC, ACT>(x, x2, d, v);
    st_bytes<VEC>(q + d, q8_of<VEC>(v, inv, a.i8));
  }
  if (lane == 0) *sc = __fdiv_rn(m, q8_max(a.i8));
}

// Quantizing rows of up to 4 vectors a thread (D <= 8192 16-bit elements): a block of 256 threads
// a row, the row held in registers between its amax and its values (one read of x, where the warp
// a row kernel reads long rows twice and the second read misses L1 at the video models' rows)
template <typename T, int NV, int ACT>
__global__ void __launch_bounds__(256) quant_block_kernel(const fusedk__quant_args a) {
  constexpr int V = 16 / sizeof(T);
  __shared__ float red[1][32];
  const int64_t row = blockIdx.x, b = row / a.L, l = row - b * a.L;
  const T *x = static_cast<const T *>(a.x.p) + b * a.x.sb + l * a.x.sl;
  const T *x2 = ACT >= 0 ? static_cast<const T *>(a.x2.p) + b * a.x2.sb + l * a.x2.sl : nullptr;
  uint8_t *q = static_cast<uint8_t *>(a.q.p) + b * a.q.sb + l * a.q.sl;
  float v[NV][V], m = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int64_t d = ((int64_t)k * 256 + threadIdx.x) * V;
    if (d < a.D) quant_src<T, V, ACT>(x, x2, d, v[k]);
#pragma unroll
    for (int i = 0; i < V; ++i) m = d < a.D ? amax_nan(m, v[k][i]) : m;
  }
  m = group_amax(m, 256, red);
  const float inv = q8_inv(m, a.i8);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int64_t d = ((int64_t)k * 256 + threadIdx.x) * V;
    if (d < a.D) st_bytes<V>(q + d, q8_of<V>(v[k], inv, a.i8));
  }
  if (threadIdx.x == 0) *(static_cast<float *>(a.qs.p) + b * a.qs.sb + l * a.qs.sl) = __fdiv_rn(m, q8_max(a.i8));
}

template <typename T, int ACT> cudaError_t quant_launch_act(const fusedk__quant_args &a, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T); // 8 (16-bit) or 4 (float32) elements: 16 bytes of T, V of e4m3
  const bool vec = a.D % V == 0 && aligned16(a.x.p) && (a.x.sb % V | a.x.sl % V) == 0 &&
                   (ACT < 0 || (aligned16(a.x2.p) && (a.x2.sb % V | a.x2.sl % V) == 0)) &&
                   ((uintptr_t)a.q.p % V | a.q.sb % V | a.q.sl % V) == 0;
  const int64_t rows = a.B * a.L, grid = (rows + 7) / 8, nvec = a.D / V;
  if (vec && !a.dequant && nvec > 256 && nvec <= 1024 && rows <= 0x7fffffff) {
    if (nvec <= 512) quant_block_kernel<T, 2, ACT><<<(unsigned)rows, 256, 0, s>>>(a);
    else quant_block_kernel<T, 4, ACT><<<(unsigned)rows, 256, 0, s>>>(a);
    return cudaGetLastError();
  }
  auto go = [&](auto vec_c) {
    constexpr int VC = decltype(vec_c)::value;
    if constexpr (ACT < 0) {
      if (a.dequant) quant_kernel<T, VC, true, -1><<<(unsigned)grid, 256, 0, s>>>(a);
      else quant_kernel<T, VC, false, -1><<<(unsigned)grid, 256, 0, s>>>(a);
    } else {
      quant_kernel<T, VC, false, ACT><<<(unsigned)grid, 256, 0, s>>>(a);
    }
    return cudaGetLastError();
  };
  return vec ? go(int_c<V>()) : go(int_c<1>());
}

// quantize_fp8 and dequantize_fp8 (act -1), or glu_fp8 with its activation as a template argument
template <typename T> cudaError_t quant_launch(const fusedk__quant_args &a, cudaStream_t s) {
  if (a.act < 0) return quant_launch_act<T, -1>(a, s);
  return dispatch_int<FUSEDK_ACT_GELU, FUSEDK_ACT_GELU_TANH, FUSEDK_ACT_SILU, FUSEDK_ACT_RELU>(
      a.act, [&](auto act_c) { return quant_launch_act<T, decltype(act_c)::value>(a, s); });
}

fusedk_status no_algo(const char *op, const char *which, const fusedk__linear_args &a) {
  return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: cuBLASLt has no algorithm for the %s GEMM (M=%lld N=%lld K=%lld, "
                      "leading dims x %lld, w %lld) with these pointer alignments; pass compact, 16-byte aligned "
                      "tensors", op, which, (long long)a.M, (long long)a.N, (long long)a.K, (long long)a.x.ld,
                      (long long)a.w.ld);
}

// linear_w8: z[m, n] = w_scale[n] * sum_k x[m, k] w[n, k] in float32 for few rows of x. A warp
// owns kW8Cols weight rows and streams them once per kW8Rows rows of x, 16 int8 weights a lane
// at a time (one 16-byte load each; VEC 1: a byte, for unaligned rows or K % 16); x's rows are
// re-read by every warp from L1. The time is the weight's bytes (a GEMV): at M = 1 the x
// conversions and FMAs are 2 instructions a weight.
constexpr int kW8Cols = 4, kW8Rows = 4;
template <typename T, int VEC>
__global__ void __launch_bounds__(256) linear_w8_kernel(const fusedk__linear_args a, float *z, int64_t zld) {
  constexpr int XV = VEC < 16 / (int)sizeof(T) ? VEC : 16 / (int)sizeof(T); // x elements a load
  const int lane = threadIdx.x & 31;
  const int64_t n0 = ((int64_t)blockIdx.x * 8 + threadIdx.x / 32) * kW8Cols;
  if (n0 >= a.N) return;
  const int nc = a.N - n0 < kW8Cols ? (int)(a.N - n0) : kW8Cols;
  const int8_t *w = static_cast<const int8_t *>(a.w.p) + n0 * a.w.ld;
  for (int64_t m0 = 0; m0 < a.M; m0 += kW8Rows) {
    const int mr = a.M - m0 < kW8Rows ? (int)(a.M - m0) : kW8Rows;
    const T *x = static_cast<const T *>(a.x.p) + m0 * a.x.ld;
    float acc[kW8Rows][kW8Cols] = {};
    for (int64_t k = lane * VEC; k < a.K; k += 32 * VEC) {
      Bytes<VEC> wr[kW8Cols]; // the rows past N read row n0's bytes again (their sums are dropped)
#pragma unroll
      for (int c = 0; c < kW8Cols; ++c) {
        const int8_t *p = w + (c < nc ? c : 0) * a.w.ld + k;
        if constexpr (VEC == 16) *reinterpret_cast<uint4 *>(wr[c].b) = __ldcs(reinterpret_cast<const uint4 *>(p));
        else wr[c].b[0] = (uint8_t)*p;
      }
#pragma unroll
      for (int r = 0; r < kW8Rows; ++r) {
        if (r >= mr) break;
        float xv[VEC];
#pragma unroll
        for (int j = 0; j < VEC; j += XV) load<T, XV, true>(x + r * a.x.ld + k + j, reinterpret_cast<float(&)[XV]>(xv[j]));
#pragma unroll
        for (int c = 0; c < kW8Cols; ++c)
#pragma unroll
          for (int i = 0; i < VEC; ++i) acc[r][c] = fmaf(xv[i], (float)(int8_t)wr[c].b[i], acc[r][c]);
      }
    }
#pragma unroll
    for (int r = 0; r < kW8Rows; ++r)
#pragma unroll
      for (int c = 0; c < kW8Cols; ++c) {
        const float t = lanes_sum(acc[r][c], 32);
        if (lane == 0 && r < mr && c < nc) z[(m0 + r) * zld + n0 + c] = t * a.ws[n0 + c];
      }
  }
}

// linear_w8: the sums into the stream's float32 scratch (no cuBLASLt call, so not its arena: no
// workspace), then linear's bias-and-activation pass (aux; GELU and SILU of z rounded)
template <typename T>
fusedk_status linear_w8(LtState &st, const fusedk__linear_args &a, int dev, cudaStream_t s, const char *op) {
  fusedk__mat z{nullptr, (a.N + 3) / 4 * 4}; // 16-byte float32 rows; none where K = 0 (z = bias)
  cudaError_t e = a.K > 0 ? st.scratch.get(dev, s, pad256((size_t)(a.M * z.ld) * sizeof(float)), 0, &z.p) : cudaSuccess;
  if (e != cudaSuccess) return arena_fail(e, op);
  if (a.K > 0) {
    const unsigned grid = (unsigned)((a.N + 8 * kW8Cols - 1) / (8 * kW8Cols));
    const bool vec = a.K % 16 == 0 && aligned16(a.w.p) && a.w.ld % 16 == 0 && aligned16(a.x.p) &&
                     a.x.ld % (16 / (int64_t)sizeof(T)) == 0;
    if (vec) linear_w8_kernel<T, 16><<<grid, 256, 0, s>>>(a, static_cast<float *>(z.p), z.ld);
    else linear_w8_kernel<T, 1><<<grid, 256, 0, s>>>(a, static_cast<float *>(z.p), z.ld);
    if ((e = cudaGetLastError()) != cudaSuccess) return on_error(e, op);
  }
  return on_error(launch_bias_act<T>(a.y, a.aux, z, true, a.bias, a.act, a.M, a.N, s, dev), op);
}

template <typename T>
fusedk_status linear_forward(LtState &st, const fusedk__linear_args &a, int dev, cudaStream_t s, const char *op) {
  if (a.op == FUSEDK_OP_LINEAR_W8) return linear_w8<T>(st, a, dev, s, op);
  LtArena ar;
  cudaError_t e = lt_arena(st, dev, s, 0, &ar);
  if (e != cudaSuccess) return arena_fail(e, op);
  fusedk_status f = FUSEDK_OK;
  bool ran = false;
  // The fused route: one GEMM writing y with bias (and RELU, GELU_TANH) in cuBLASLt's epilogue;
  // GELU_TANH's aux from it too; GELU, SILU and RELU with aux: z into aux (else y), then the act
  // pass; NONE with aux: y copied. Needs 16-byte rows of every matrix and an aligned bias
  // (cuBLASLt's bf16 output from unaligned rows of x and w is several ulps off). FP8: e4m3 x and
  // w (K a multiple of 16, as its kernels take) with their scale vectors in the epilogue.
  const bool fp8 = a.op == FUSEDK_OP_LINEAR_FP8;
  const bool aligned = rows16<T>(a.y.p, a.y.ld) && (!a.bias || aligned16(a.bias)) &&
                       (!a.aux.p || rows16<T>(a.aux.p, a.aux.ld)) &&
                       (fp8 ? rows16<uint8_t>(a.x.p, a.x.ld) && rows16<uint8_t>(a.w.p, a.w.ld) && a.K % 16 == 0 &&
                                  aligned16(a.xs) && aligned16(a.ws)
                            : rows16<T>(a.x.p, a.x.ld) && rows16<T>(a.w.p, a.w.ld));
  if (a.K > 0 && aligned) {
    const bool gelu_epi = a.act == FUSEDK_ACT_GELU_TANH, relu_epi = a.act == FUSEDK_ACT_RELU && !a.aux.p;
    const bool fused_act = a.act == FUSEDK_ACT_NONE || gelu_epi || relu_epi;
    const fusedk__mat z = a.aux.p && !fused_act ? a.aux : a.y;
    cublasLtEpilogue_t epi = a.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (relu_epi) epi = a.bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    if (gelu_epi)
      epi = a.aux.p ? (a.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                    : (a.bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU);
    const LtGemm g{CUBLAS_OP_T, CUBLAS_OP_N, a.N, a.M, a.K, a.w.p, a.x.p, a.w.ld, a.x.ld, z.p, z.ld, epi, a.bias,
                   gelu_epi ? a.aux.p : nullptr, a.aux.ld, false, fp8 ? FUSEDK_E4M3 : a.scalar, a.tf32, false,
                   a.scalar, fp8 ? a.ws : nullptr, fp8 ? a.xs : nullptr, fp8 && a.fast_accum};
    if ((f = lt_matmul(st, g, dev, s, ar.ws, op, &ran))) return f;
    if (ran) {
      if (a.act == FUSEDK_ACT_NONE && a.aux.p) // aux = z = y
        return on_error(cudaMemcpy2DAsync(a.aux.p, (size_t)a.aux.ld * sizeof(T), a.y.p, (size_t)a.y.ld * sizeof(T),
                                          (size_t)a.N * sizeof(T), (size_t)a.M, cudaMemcpyDeviceToDevice, s), op);
      return fused_act ? FUSEDK_OK : act_pass(a, z, dev, s, op);
    }
  }
  // The exact route (unaligned rows, an epilogue cuBLASLt refused, K = 0): the GEMM in float32
  // into scratch, then one pass adds the bias, writes aux, applies act and rounds once. FP8: x
  // and w dequantized to float32 rows in scratch first (a float32 GEMM, no TF32).
  fusedk__mat z32{nullptr, (a.N + 3) / 4 * 4}, x = a.x, w = a.w; // 16-byte float32 rows
  if (a.K > 0) {
    const int64_t k32 = (a.K + 3) / 4 * 4;
    const size_t zb = pad256((size_t)(a.M * z32.ld) * sizeof(float)), xb = pad256((size_t)(a.M * k32) * sizeof(float));
    const size_t wb = fp8 ? (size_t)(a.N * k32) * sizeof(float) : 0;
    if ((e = lt_arena(st, dev, s, zb + (fp8 ? xb + wb : 0), &ar)) != cudaSuccess) return arena_fail(e, op);
    z32.p = ar.scratch;
    if (fp8) {
      x = fusedk__mat{static_cast<char *>(ar.scratch) + zb, k32}, w = fusedk__mat{static_cast<char *>(ar.scratch) + zb + xb, k32};
      const fusedk__quant_args qx{FUSEDK_F32, 1, -1, 1, a.M, a.K, {x.p, 0, x.ld}, {}, {a.x.p, 0, a.x.ld}, {(void *)a.xs, 0, 1}, 0};
      const fusedk__quant_args qw{FUSEDK_F32, 1, -1, 1, a.N, a.K, {w.p, 0, w.ld}, {}, {a.w.p, 0, a.w.ld}, {(void *)a.ws, 0, 1}, 0};
      if ((e = quant_launch<float>(qx, s)) != cudaSuccess || (e = quant_launch<float>(qw, s)) != cudaSuccess)
        return on_error(e, op);
    }
    const LtGemm g{CUBLAS_OP_T, CUBLAS_OP_N, a.N, a.M, a.K, w.p, x.p, w.ld, x.ld, z32.p, z32.ld,
                   CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0, true, fp8 ? FUSEDK_F32 : a.scalar, fp8 ? 0 : a.tf32, false};
    if ((f = lt_matmul(st, g, dev, s, ar.ws, op, &ran))) return f;
    if (!ran) return no_algo(op, "forward", a);
  }
  return on_error(launch_bias_act<T>(a.y, a.aux, z32, true, a.bias, a.act, a.M, a.N, s, dev), op);
}

// The backward's dz pass: blocks of 32 * VEC columns by chunks of rows, about 4 blocks an SM
// (with db, each chunk's column sums go to part[chunk], then one pass sums them in chunk order).
// dz_ld: 16-byte rows of dz in scratch (written only for act != NONE: dz = dy otherwise).
struct DzPass {
  int64_t chunks, dz_ld;
  size_t dz_bytes, part_bytes; // 256-byte padded
};
template <typename T> DzPass dz_plan(int64_t M, int64_t N, int act, bool need_dz, bool db, int dev) {
  constexpr int V = 16 / sizeof(T);
  const int64_t col_blocks = (N + 32 * V - 1) / (32 * V);
  DzPass p;
  p.chunks = M > 0 && N > 0 ? std::max<int64_t>(1, std::min<int64_t>((M + 7) / 8,
                                  ((int64_t)device_sms(dev) * 4 + col_blocks - 1) / col_blocks)) : 0;
  p.dz_ld = (N + V - 1) / V * V;
  p.dz_bytes = pad256(need_dz && act != FUSEDK_ACT_NONE && M > 0 && N > 0 ? (size_t)(M * p.dz_ld) * sizeof(T) : 0);
  p.part_bytes = pad256(db ? (size_t)(p.chunks * N) * sizeof(float) : 0);
  return p;
}

// Runs the pass: dz (p.dz_bytes != 0) and db (part != NULL; M = 0: zeros)
template <typename T> cudaError_t dz_run(const DzPass &p, fusedk__mat dz, fusedk__mat dy, fusedk__mat aux, int act,
                                         void *db, float *part, int64_t M, int64_t N, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  const bool need_dz = p.dz_bytes != 0;
  if (!need_dz && !part) return db && N ? cudaMemsetAsync(db, 0, (size_t)N * sizeof(T), s) : cudaSuccess;
  const bool vec = N % V == 0 && aligned16(dy.p) && dy.ld % V == 0 &&
                   (act == FUSEDK_ACT_NONE || (aligned16(aux.p) && aux.ld % V == 0));
  const int64_t rpc = (M + p.chunks - 1) / p.chunks; // M, N > 0 here: chunks >= 1
  auto go = [&](auto act_c, auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    const int64_t cb = (N + 32 * VEC - 1) / (32 * VEC), ch = (M + rpc - 1) / rpc;
    linear_dz_kernel<T, VEC, decltype(act_c)::value><<<dim3((unsigned)cb, (unsigned)ch), dim3(32, 8), 0, s>>>(
        need_dz ? dz : fusedk__mat{nullptr, 0}, dy, aux, part, M, N, rpc);
    cudaError_t r = cudaGetLastError();
    if (r == cudaSuccess && part) {
      linear_db_kernel<T><<<(unsigned)((N + 255) / 256), 256, 0, s>>>(static_cast<T *>(db), part, ch, N);
      r = cudaGetLastError();
    }
    return r;
  };
  return dispatch_int<FUSEDK_ACT_NONE, FUSEDK_ACT_RELU, FUSEDK_ACT_GELU, FUSEDK_ACT_GELU_TANH, FUSEDK_ACT_SILU>(
      act, [&](auto act_c) { return vec ? go(act_c, int_c<V>()) : go(act_c, int_c<1>()); });
}

template <typename T>
fusedk_status linear_backward(LtState &st, const fusedk__linear_args &a, int dev, cudaStream_t s, const char *op) {
  const DzPass dp = dz_plan<T>(a.M, a.N, a.act, a.dx.p || a.dw.p, a.db != nullptr, dev);
  // dx, dw with rows cuBLASLt should not write in T: a float32 result in scratch, then converted
  const bool dx32 = a.dx.p && !rows16<T>(a.dx.p, a.dx.ld), dw32 = a.dw.p && !rows16<T>(a.dw.p, a.dw.ld);
  const int64_t ld32 = (a.K + 3) / 4 * 4; // 16-byte float32 rows
  const size_t f32 = (size_t)std::max(dx32 ? a.M * ld32 : 0, dw32 ? a.N * ld32 : 0) * sizeof(float);
  LtArena ar;
  cudaError_t e = lt_arena(st, dev, s, dp.dz_bytes + dp.part_bytes + f32, &ar);
  if (e != cudaSuccess) return arena_fail(e, op);
  void *out32 = static_cast<char *>(ar.scratch) + dp.dz_bytes + dp.part_bytes;
  const fusedk__mat dz = dp.dz_bytes ? fusedk__mat{ar.scratch, dp.dz_ld} : a.dy;
  float *part = a.db && dp.chunks ? reinterpret_cast<float *>(static_cast<char *>(ar.scratch) + dp.dz_bytes) : nullptr;
  if ((e = dz_run<T>(dp, dz, a.dy, a.aux, a.act, a.db, part, a.M, a.N, s)) != cudaSuccess) return on_error(e, op);
  // dx[M, K] = dz w: column-major dx^T[K, M] = w^T[K, N] dz^T[N, M]
  // dw[N, K] = dz^T x: column-major dw^T[K, N] = x^T[K, M] dz[M, N]
  const bool to32[2] = {dx32, dw32};
  const LtGemm gs[2] = {
      {CUBLAS_OP_N, CUBLAS_OP_N, a.K, a.M, a.N, a.w.p, dz.p, a.w.ld, dz.ld, dx32 ? out32 : a.dx.p, dx32 ? ld32 : a.dx.ld,
       CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0, dx32, a.scalar, a.tf32, false},
      {CUBLAS_OP_N, CUBLAS_OP_T, a.K, a.N, a.M, a.x.p, dz.p, a.x.ld, dz.ld, dw32 ? out32 : a.dw.p, dw32 ? ld32 : a.dw.ld,
       CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0, dw32, a.scalar, a.tf32, false}};
  const fusedk__mat outs[2] = {a.dx, a.dw};
  for (int i = 0; i < 2; ++i) {
    const LtGemm &g = gs[i];
    if (!outs[i].p || g.m == 0 || g.n == 0) continue;
    if (g.k == 0) { // a sum of no terms (N = 0 for dx, M = 0 for dw)
      e = cudaMemset2DAsync(outs[i].p, (size_t)outs[i].ld * sizeof(T), 0, (size_t)g.m * sizeof(T), (size_t)g.n, s);
      if (e != cudaSuccess) return cuda_fail(e, op, "memset");
      continue;
    }
    bool ran;
    fusedk_status f = lt_matmul(st, g, dev, s, ar.ws, op, &ran);
    if (f) return f;
    if (!ran) return no_algo(op, i ? "dw" : "dx", a);
    if (to32[i] && (e = launch_bias_act<T>(outs[i], fusedk__mat{nullptr, 0}, fusedk__mat{out32, ld32}, true, nullptr,
                                           FUSEDK_ACT_NONE, g.n, g.m, s, dev)) != cudaSuccess)
      return on_error(e, op);
  }
  return FUSEDK_OK;
}

#endif // FUSEDK__PART_LINEAR

#if FUSEDK__PART_ATTENTION
// ---------------------------------------------------------------------------------------------
// [attention] softmax attention in one pass over the keys (flash attention, forward).
//
// Portable path (sm_80+, attn_kernel): a block owns BR = 16 MT WARPS query rows of one (b, h),
// 16 MT a warp, and walks the keys in tiles of BC: S = Q K^T (mma.sync; Q stays in shared memory
// and is re-read by ldmatrix, which leaves the registers to O) -> scale, mask, online softmax in
// registers -> P, packed to 16 bits in registers as the next product's operand -> O += P V. Q,
// one K and one V tile sit in swizzled shared memory; V[j]'s copy runs under S's product and
// softmax, K[j+1]'s under P V (FlashAttention-2's schedule). A warp's MT row tiles share each
// K and V fragment it loads: shared-memory reads per flop fall as 1 / MT. Scores are scaled by
// scale * log2(e) before the row max (a negative scale stays correct) and exponentiated by exp2.
// Head sizes up to 256 run on the next tile width D (64, 128, 256), the columns past Dh zeros.
// ---------------------------------------------------------------------------------------------

// A launch plan: warps a block, 16-row tiles a warp (MT), keys a tile (BC), the blocks an SM
// keeps (which caps registers: 65536 / (blocks x threads)), and whether S's fragments are
// prefetched a k step ahead (attn_scores).
template <int WARPS, int MT, int BC, int MIN_BLOCKS, bool PF = false> struct AttnShape {
  static constexpr int kWarps = WARPS, kMt = MT, kBc = BC, kMinBlocks = MIN_BLOCKS, kRows = 16 * MT * WARPS;
  static constexpr bool kPf = PF;
};
// the plan per tile width D (bench/attn_plans.cu; bench/NOTES.md): two row tiles a warp where
// the registers allow (half the shared-memory reads of K and V a flop); Dh 256: one, and 32
// keys a tile (96 KB of shared memory: sm_86 and sm_89 blocks get 99 KB); Dh 64's S fragments a
// step ahead (its O, half of Dh 128's, leaves registers for the second set; at Dh 128 the set
// would take registers from O)
template <int D> struct AttnPlan;
template <> struct AttnPlan<64> { using type = AttnShape<4, 2, 64, 2, true>; };
template <> struct AttnPlan<128> { using type = AttnShape<4, 2, 64, 2>; };
template <> struct AttnPlan<256> { using type = AttnShape<8, 1, 32, 1>; };

// how many keys query row i sees: those before kv (kv_len, clamped) and, causal, those before
// i + Sk - Sq + 1
__device__ __forceinline__ int64_t attn_keys(const fusedk__attn_args &a, int64_t kv, int64_t i) {
  return a.causal ? max((int64_t)0, min(kv, i + a.Sk - a.Sq + 1)) : kv;
}
// the keys of batch b that any row sees: kv_len[b] clamped to [0, Sk]
__device__ __forceinline__ int64_t attn_kv(const fusedk__attn_args &a, int64_t b) {
  return a.kv_len ? max((int64_t)0, min(a.Sk, (int64_t)a.kv_len[b * a.kv_stride])) : a.Sk;
}

// 2^x in one MUFU op (flush-to-zero: weights below 2^-126 of the row's max are 0); exp2f adds a
// denormal range fix-up around it, 3 more instructions an element
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// max over the 4 lanes of a quad (the lanes holding one accumulator row; their sum: lanes_sum)
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// S = Q K^T for the warp's MT row tiles: Q (kA, re-read from shared memory: the registers stay
// O's) and K ([key, d]: kB), each K fragment used by every row tile
template <typename T, int D, int MT, int BC, bool PF>
__device__ __forceinline__ void attn_scores(float (&s)[MT][BC / 8][4], const WarpOperand<D / 8, kA> &lq,
                                            const WarpOperand<D / 8, kB> &lk) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int t = 0; t < BC / 8; ++t) s[mt][t][0] = s[mt][t][1] = s[mt][t][2] = s[mt][t][3] = 0.f;
  warp_mma<T, MT, BC / 16, D / 16, 1, PF>([&](int i, int t) -> float(&)[4] { return s[i][t]; }, lq, lk);
}

// Online softmax over one tile of raw scores s for the thread's two rows (hf 0: c0 c1, hf 1:
// c2 c3 of each n8 tile), c = scale * log2(e): the running max m (of the scaled scores), l
// rescaled to it, s replaced by exp2(s c - m) (one FFMA and one MUFU an element); alpha[hf], the
// factor O's rows take (attn_rescale: the caller picks the moment, O may be in a product still).
// The row's extreme raw score is its max when c > 0 and its min when c < 0 (a uniform branch);
// masked scores are -inf or +inf to match (attn_mask), so that s c is -inf. A row that has
// seen only masked keys keeps m = -inf and contributes zeros (its shift is 0: no inf - inf).
template <int BC>
__device__ __forceinline__ void attn_softmax(float (&s)[BC / 8][4], float c, float (&m)[2], float (&l)[2],
                                             float (&alpha)[2]) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float x = s[0][2 * hf];
    if (c > 0.f) {
#pragma unroll
      for (int t = 0; t < BC / 8; ++t) x = fmaxf(x, fmaxf(s[t][2 * hf], s[t][2 * hf + 1]));
      x = quad_max(x);
    } else {
#pragma unroll
      for (int t = 0; t < BC / 8; ++t) x = fminf(x, fminf(s[t][2 * hf], s[t][2 * hf + 1]));
      x = -quad_max(-x);
    }
    const float mx = fmaxf(m[hf], x * c), shift = mx == -INFINITY ? 0.f : mx;
    alpha[hf] = exp2_ftz(m[hf] - shift), m[hf] = mx, l[hf] *= alpha[hf];
#pragma unroll
    for (int t = 0; t < BC / 8; ++t) {
      s[t][2 * hf] = exp2_ftz(fmaf(s[t][2 * hf], c, -shift));
      s[t][2 * hf + 1] = exp2_ftz(fmaf(s[t][2 * hf + 1], c, -shift));
      l[hf] += s[t][2 * hf] + s[t][2 * hf + 1];
    }
  }
}
template <int D> __device__ __forceinline__ void attn_rescale(float (&o)[D / 8][4], const float (&alpha)[2]) {
#pragma unroll
  for (int t = 0; t < D / 8; ++t) o[t][0] *= alpha[0], o[t][1] *= alpha[0], o[t][2] *= alpha[1], o[t][3] *= alpha[1];
}
// attn_rescale where some row of the warp took a new max (a uniform branch: mostly none did)
template <int D> __device__ __forceinline__ void attn_rescale_moved(float (&o)[D / 8][4], const float (&alpha)[2]) {
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) attn_rescale<D>(o, alpha);
}

// O += P V: P's accumulator pairs are the a operand (pack_a); V ([key, d]: kBt)
template <typename T, int D, int MT, int BC>
__device__ __forceinline__ void attn_pv(float (&o)[MT][D / 8][4], const float (&s)[MT][BC / 8][4],
                                        const WarpOperand<D / 8, kBt> &lv) {
  uint32_t pa[MT][BC / 16][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) pack_a<T, BC>(pa[mt], s[mt]);
  warp_mma<T, MT, D / 16, BC / 16>([&](int i, int t) -> float(&)[4] { return o[i][t]; }, in_regs(pa), lv);
}

// O / l of one warp's 16-row tile (block rows row0 + [0, 16)): each lane's two accumulator rows
// (lane / 4, + 8) rounded into the tile's own Q rows in shared memory (no other warp reads them),
// then whole 16-byte chunks a lane to global; lse from the max and the sum. l == 0 (no key seen):
// 0 and -inf; a NaN l stays NaN.
template <typename T, int D, bool VEC>
__device__ __forceinline__ void attn_store(const fusedk__attn_args &a, float (&o)[D / 8][4], const float (&m)[2],
                                           float (&l)[2], uint32_t sq, int row0, int64_t b, int64_t h, int64_t i0,
                                           int lane) {
  constexpr int CH = D / 8;
  auto at = [&](int r, int c) { return sq + swz<CH>(row0 + r, c); };
  const int frag = lane / 4, tid = lane;
  float inv[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) l[hf] = lanes_sum(l[hf], 4), inv[hf] = l[hf] == 0.f ? 0.f : 1.f / l[hf];
#pragma unroll
  for (int t = 0; t < D / 8; ++t)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      asm volatile("st.shared.b32 [%0], %1;" ::"r"(at(frag + 8 * hf, t) + (tid % 4) * 4),
                   "r"(l[hf] == 0.f ? 0u : pack2<T>(o[t][2 * hf] * inv[hf], o[t][2 * hf + 1] * inv[hf]))
                   : "memory");
  if (a.lse.p && tid % 4 == 0)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int64_t i = i0 + row0 + frag + 8 * hf;
      if (i < a.Sq)
        a.lse.p[b * a.lse.sb + h * a.lse.sh + i * a.lse.ss] =
            l[hf] == 0.f ? -INFINITY : (m[hf] + __log2f(l[hf])) * 0.6931471805599453f;
    }
  __syncwarp();
  T *out = (T *)a.out.p + b * a.out.sb + h * a.out.sh;
#pragma unroll
  for (int k = 0; k < 16 * CH / 32; ++k) {
    const int idx = k * 32 + tid, r = idx / CH, c = idx % CH;
    const int64_t i = i0 + row0 + r;
    if (i >= a.Sq || c * 8 >= a.Dh) continue;
    uint32_t w[4];
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                 : "r"(at(r, c)));
    T *p = out + i * a.out.ss + c * 8;
    if constexpr (VEC) *reinterpret_cast<uint4 *>(p) = make_uint4(w[0], w[1], w[2], w[3]);
    else
      for (int e = 0; e < 8 && c * 8 + e < a.Dh; ++e)
        reinterpret_cast<uint16_t *>(p)[e] = (uint16_t)(w[e / 2] >> (16 * (e % 2)));
  }
}

// Work unit `unit` (of n_mb * B * Hq): query block mb of (b, h), and its keys: kv (kv_len[b]
// clamped), those the block's last and first rows see (n_hi, n_lo). Units run (b, h)-major, so
// that the blocks of one head share its K and V in L2, and a head's last query blocks first:
// under a causal mask they see the most keys, and the short ones fill the tail.
struct AttnBlock {
  int64_t b, h, hk, i0, rows, kv, n_hi, n_lo;
  __device__ __forceinline__ AttnBlock(const fusedk__attn_args &a, int n_mb, int br, int64_t unit) {
    const int64_t bh = unit / n_mb;
    const int mb = n_mb - 1 - (int)(unit % n_mb);
    b = bh / a.Hq, h = bh % a.Hq, hk = h / (a.Hq / a.Hkv), i0 = (int64_t)mb * br, rows = min((int64_t)br, a.Sq - i0);
    kv = attn_kv(a, b);
    n_hi = attn_keys(a, kv, i0 + rows - 1), n_lo = attn_keys(a, kv, i0);
  }
};

// Masks the keys past each row's limit (lim, absolute) in one row tile of raw scores when the
// tile at j0 is an edge one (some row of the block sees only part of it): -inf, or +inf when the
// scale is negative, so that the scaled score is -inf (attn_softmax).
template <int BC>
__device__ __forceinline__ void attn_mask(float (&s)[BC / 8][4], float c, const int64_t (&lim)[2], int64_t j0,
                                          bool edge, int c0) {
  if (!edge) return;
  const float masked = c > 0.f ? -INFINITY : INFINITY;
  const int rel[2] = {(int)min(lim[0] - j0, (int64_t)BC), (int)min(lim[1] - j0, (int64_t)BC)};
#pragma unroll
  for (int t = 0; t < BC / 8; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (t * 8 + c0 + (e & 1) >= rel[e >> 1]) s[t][e] = masked;
}

// One block: BR query rows of one (b, h), in AttnBlock's order. Warp w owns rows [16 MT w, + 16 MT).
template <typename T, int D, typename P, bool VEC>
__global__ void __launch_bounds__(P::kWarps * 32, P::kMinBlocks)
    attn_kernel(const fusedk__attn_args a, int n_mb, float scale_log2) {
  constexpr int BR = P::kRows, BC = P::kBc, MT = P::kMt, CH = D / 8, NT = 32 * P::kWarps;
  extern __shared__ __align__(128) unsigned char attn_smem[];
  const uint32_t sq = smem_u32(attn_smem), sk = sq + BR * D * 2, sv = sk + BC * D * 2;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const AttnBlock blk(a, n_mb, BR, blockIdx.x);
  const int64_t b = blk.b, h = blk.h, i0 = blk.i0, n_hi = blk.n_hi;
  const int n_tiles = (int)((n_hi + BC - 1) / BC), dh = (int)a.Dh;
  const T *k = (const T *)a.k.p + b * a.k.sb + blk.hk * a.k.sh, *v = (const T *)a.v.p + b * a.v.sb + blk.hk * a.v.sh;

  load_tile<T, BR, CH, NT, VEC>(sq, (const T *)a.q.p + b * a.q.sb + i0 * a.q.ss + h * a.q.sh, a.q.ss, (int)blk.rows,
                                dh);

  float o[MT][D / 8][4], m[MT][2], l[MT][2];
  int64_t lim[MT][2]; // the keys each of the thread's rows sees
  const int row0 = warp * 16 * MT, c0 = 2 * (lane % 4);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int t = 0; t < D / 8; ++t) o[mt][t][0] = o[mt][t][1] = o[mt][t][2] = o[mt][t][3] = 0.f;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      m[mt][hf] = -INFINITY, l[mt][hf] = 0.f, lim[mt][hf] = attn_keys(a, blk.kv, i0 + row0 + 16 * mt + lane / 4 + 8 * hf);
  }
  const WarpOperand<CH, kA> lq = WarpOperand<CH, kA>(sq, lane).i_from(warp * MT);
  const WarpOperand<CH, kB> lk(sk, lane);
  const WarpOperand<CH, kBt> lv(sv, lane);
  // V[j]'s copy runs under S's product and softmax, K[j+1]'s under P V (FlashAttention-2's
  // schedule): one barrier before each product frees the buffer the next copy fills
  if (n_tiles) load_tile<T, BC, CH, NT, VEC>(sk, k, a.k.ss, (int)min((int64_t)BC, n_hi), dh);
  cp_async_commit(); // with Q's copies
  for (int j = 0; j < n_tiles; ++j) {
    const int64_t j0 = (int64_t)j * BC;
    cp_async_wait<0>(); // K[j] (and Q) landed; after the barrier every warp is done with V[j-1]
    __syncthreads();
    load_tile<T, BC, CH, NT, VEC>(sv, v + j0 * a.v.ss, a.v.ss, (int)min((int64_t)BC, n_hi - j0), dh);
    cp_async_commit();
    float s[MT][BC / 8][4];
    attn_scores<T, D, MT, BC, P::kPf>(s, lq, lk);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      attn_mask<BC>(s[mt], scale_log2, lim[mt], j0, j0 + BC > blk.n_lo, c0);
      float alpha[2];
      attn_softmax<BC>(s[mt], scale_log2, m[mt], l[mt], alpha);
      attn_rescale<D>(o[mt], alpha);
    }
    cp_async_wait<0>(); // V[j] landed; after the barrier every warp is done with K[j]
    __syncthreads();
    if (j + 1 < n_tiles)
      load_tile<T, BC, CH, NT, VEC>(sk, k + (j0 + BC) * a.k.ss, a.k.ss, (int)min((int64_t)BC, n_hi - j0 - BC), dh);
    cp_async_commit();
    attn_pv<T, D, MT, BC>(o, s, lv);
  }
  cp_async_wait<0>(); // Q landed even when no key tile ran
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) attn_store<T, D, VEC>(a, o[mt], m[mt], l[mt], sq, row0 + 16 * mt, b, h, i0, lane);
}

template <typename T, int D, typename P, bool VEC>
cudaError_t launch_attn(const fusedk__attn_args &a, cudaStream_t s, int dev) {
  constexpr size_t smem = (size_t)(P::kRows + 2 * P::kBc) * D * sizeof(T);
  const int64_t n_mb = (a.Sq + P::kRows - 1) / P::kRows;
  const cudaError_t e = smem_opt_in<attn_kernel<T, D, P, VEC>>(smem, 0, dev);
  if (e != cudaSuccess) return e;
  attn_kernel<T, D, P, VEC><<<(unsigned)(n_mb * a.B * a.Hq), 32 * P::kWarps, smem, s>>>(a, (int)n_mb,
                                                                                      a.scale * 1.4426950408889634f);
  return cudaGetLastError();
}

// O / l and lse of the thread's two accumulator rows i, i + 8 straight from registers (a 4-byte
// store a thread an n8 tile: the Hopper kernel's shared memory is the next unit's by then; two
// 2-byte ones where out's rows are not 4-byte aligned: pairs false).
template <typename T, int D>
__device__ __forceinline__ void attn_store_regs(const fusedk__attn_args &a, float (&o)[D / 8][4], const float (&m)[2],
                                                float (&l)[2], int64_t i, int64_t b, int64_t h, int lane,
                                                bool pairs = true) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    l[hf] = lanes_sum(l[hf], 4);
    const float inv = l[hf] == 0.f ? 0.f : 1.f / l[hf];
    const int64_t r = i + 8 * hf;
    if (r >= a.Sq) continue;
    T *out = (T *)a.out.p + b * a.out.sb + r * a.out.ss + h * a.out.sh + 2 * (lane % 4);
    // a row that saw no key is 0, also where its weights of 0 met an Inf of v in P V (0 times Inf)
    auto y = [&](float x) { return l[hf] == 0.f ? 0.f : x * inv; };
#pragma unroll
    for (int t = 0; t < D / 8; ++t)
      if (t * 8 >= a.Dh) continue;
      else if (pairs) *reinterpret_cast<uint32_t *>(out + 8 * t) = pack2<T>(y(o[t][2 * hf]), y(o[t][2 * hf + 1]));
      else out[8 * t] = from_f32<T>(y(o[t][2 * hf])), out[8 * t + 1] = from_f32<T>(y(o[t][2 * hf + 1]));
    if (a.lse.p && lane % 4 == 0)
      a.lse.p[b * a.lse.sb + h * a.lse.sh + r * a.lse.ss] =
          l[hf] == 0.f ? -INFINITY : (m[hf] + __log2f(l[hf])) * 0.6931471805599453f;
  }
}

// The persistent kernel's items (the producer picks them; attn_next). Units alike: units [0,
// full) go round robin, whole; with a split (R > 0: R units left over a last wave would leave
// blocks idle), the last R units' R T tile steps (T key tiles a unit) are shared evenly, block b
// taking steps [b R T / grid, (b + 1) R T / grid): at most T (R < grid), so at most two pieces,
// each a tile range of one unit. The blocks owning a unit's steps each write their piece's O
// (unnormalized), m and l to their slot in `part` (2 a block) and count themselves in `cnt`; the
// last to arrive merges every slot and stores (flash-decoding's combine, inside the launch, with
// nothing to wait on). Units whose work varies (causal, kv_len; `next` set): each block's next
// unit comes from a launch-wide counter, in AttnBlock's order (a head's longest rows first).
struct AttnSplit {
  int64_t full; // the units that go whole: every one when R = 0, else `waves` grids of them
  int waves, R, T; // grid R T < 2^31 (32-bit steps)
  float4 *part;
  int *cnt; // pieces done a (tail unit, consumer, warp); the merging piece sets it back to 0
  unsigned long long *next; // units handed out past the first grid, then blocks done (2 words)
};
struct AttnItem {
  int64_t u;
  int jb, je, slot; // key tiles [jb, je) (je = -1: all the unit's); a piece's slot, -1 for a whole unit
};
#if FUSEDK__SM90A // the schedule's device functions: the sm_90a kernel's alone
// a release / acquire fence at GPU scope (around the relaxed atomic that counts a split unit's
// pieces), lighter than __threadfence's sequentially consistent one
__device__ __forceinline__ void fence_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
__device__ __forceinline__ int attn_step0(const AttnSplit &sp, int b) {
  return (int)((uint32_t)(b * sp.R * sp.T) / gridDim.x);
}
// the block owning tail step p: the last b with step0(b) <= p
__device__ __forceinline__ int attn_owner(const AttnSplit &sp, int p) {
  return (int)(((uint32_t)(p + 1) * gridDim.x + sp.R * sp.T - 1) / (uint32_t)(sp.R * sp.T)) - 1;
}
__device__ __forceinline__ int attn_slot(const AttnSplit &sp, int b, int u0) { return 2 * b + (attn_step0(sp, b) >= u0 ? 0 : 1); }
// the block's item k; u = -1 past its last (returned by value: a struct written through a
// reference stays in local memory)
__device__ __forceinline__ AttnItem attn_item(const AttnSplit &sp, int k) {
  const int bx = blockIdx.x;
  if (bx + (int64_t)k * gridDim.x < sp.full) return AttnItem{bx + (int64_t)k * gridDim.x, 0, -1, -1};
  k -= sp.waves;
  const int s0 = attn_step0(sp, bx), s1 = attn_step0(sp, bx + 1), ut = s0 / max(sp.T, 1) + k, u0 = ut * sp.T;
  if (sp.R == 0 || k > 1 || u0 >= s1) return AttnItem{-1, 0, 0, -1};
  const bool whole = attn_owner(sp, u0) == attn_owner(sp, u0 + sp.T - 1);
  return AttnItem{sp.full + ut, max(s0, u0) - u0, min(s1, u0 + sp.T) - u0, whole ? -1 : attn_slot(sp, bx, u0)};
}

// the block's item k: from the static schedule, or from the counter; past the last, u = -1, and
// the last block to get there sets the counters back to 0 for the next launch
__device__ __forceinline__ AttnItem attn_next(const AttnSplit &sp, int k) {
  if (!sp.next) return attn_item(sp, k);
  const int64_t u = k == 0 ? blockIdx.x : gridDim.x + (int64_t)atomicAdd(sp.next, 1ull);
  if (u < sp.full) return AttnItem{u, 0, -1, -1};
  if (atomicAdd(sp.next + 1, 1ull) == gridDim.x - 1) sp.next[0] = sp.next[1] = 0;
  return AttnItem{-1, 0, 0, -1};
}

// A piece's end, per consumer thread (its two rows' O fragments, m, and its share of l) and per
// warp (a counter for its 16 rows): the slot written, then the count; the unit's last piece sums
// every piece's slot, weighted by 2^(m_s - M), in block order (the same bits whichever piece
// merges), and stores as a whole unit does.
template <typename T, int D, int NC>
__device__ __forceinline__ void attn_piece_store(const fusedk__attn_args &a, const AttnSplit &sp, const AttnItem &w,
                                                 float (&o)[D / 8][4], float (&m)[2], float (&l)[2], int wg, int tid,
                                                 int64_t i, int64_t b, int64_t h, bool pairs = true) {
  constexpr int F = D / 8 + 1; // float4s a thread: O's n8 tiles, then m and l
  auto at = [&](int slot) { return sp.part + ((int64_t)slot * NC + wg) * F * 128 + tid; };
  float4 *p = at(w.slot);
#pragma unroll
  for (int t = 0; t < D / 8; ++t) __stcg(p + t * 128, make_float4(o[t][0], o[t][1], o[t][2], o[t][3]));
  __stcg(p + (F - 1) * 128, make_float4(m[0], m[1], l[0], l[1]));
  __syncwarp(); // the warp's slot stores, then lane 0 releases them all (fences are cumulative)
  const int lane = tid % 32;
  const int u0 = (int)(w.u - sp.full) * sp.T; // the unit's first tail step
  const int b0 = attn_owner(sp, u0), b1 = attn_owner(sp, u0 + sp.T - 1);
  int *cnt = sp.cnt + ((w.u - sp.full) * NC + wg) * 4 + tid / 32, last = 0;
  if (lane == 0) {
    fence_gpu();
    last = atomicAdd(cnt, 1) == b1 - b0;
    if (last) *cnt = 0, fence_gpu(); // the next launch's count starts from 0; the others' slots acquired
  }
  if (!__shfl_sync(0xffffffffu, last, 0)) return;
  __syncwarp();
  float shift[2] = {-INFINITY, -INFINITY};
  for (int bb = b0; bb <= b1; ++bb) {
    const float4 ml = __ldcg(at(attn_slot(sp, bb, u0)) + (F - 1) * 128);
    shift[0] = fmaxf(shift[0], ml.x), shift[1] = fmaxf(shift[1], ml.y);
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) m[hf] = shift[hf], shift[hf] = m[hf] == -INFINITY ? 0.f : m[hf], l[hf] = 0.f;
#pragma unroll
  for (int t = 0; t < D / 8; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.f;
  // PN pieces a round, their loads in flight together (two below Dh 256: the registers hold them)
  constexpr int PN = D <= 128 ? 2 : 1;
  for (int bb = b0; bb <= b1; bb += PN) {
    const float4 *q[PN];
    float4 ml[PN], x[PN][D / 8];
#pragma unroll
    for (int n = 0; n < PN; ++n) q[n] = at(attn_slot(sp, min(bb + n, b1), u0)), ml[n] = __ldcg(q[n] + (F - 1) * 128);
#pragma unroll
    for (int n = 0; n < PN; ++n)
#pragma unroll
      for (int t = 0; t < D / 8; ++t) x[n][t] = __ldcg(q[n] + t * 128);
#pragma unroll
    for (int n = 0; n < PN; ++n) {
      if (bb + n > b1) continue;
      const float w0 = exp2_ftz(ml[n].x - shift[0]), w1 = exp2_ftz(ml[n].y - shift[1]);
      l[0] = fmaf(ml[n].z, w0, l[0]), l[1] = fmaf(ml[n].w, w1, l[1]);
#pragma unroll
      for (int t = 0; t < D / 8; ++t) {
        o[t][0] = fmaf(x[n][t].x, w0, o[t][0]), o[t][1] = fmaf(x[n][t].y, w0, o[t][1]);
        o[t][2] = fmaf(x[n][t].z, w1, o[t][2]), o[t][3] = fmaf(x[n][t].w, w1, o[t][3]);
      }
    }
  }
  attn_store_regs<T, D>(a, o, m, l, i, b, h, lane, pairs);
}
#endif // FUSEDK__SM90A

// Hopper path (sm_90a, attn_tma_kernel): a block of 1 + NC warpgroups owns 64 NC query rows of one
// (b, h). Warpgroup 0 produces: one thread issues the TMA loads, Q once, then K and V tiles of BC
// keys into a ring of stages, each tile completing on its mbarrier, a stage refilled once every
// consumer has released it; it hands its registers to the consumers (setmaxnreg). Warpgroups
// 1..NC consume 64 rows each: S = Q K^T (wgmma, both from shared memory), scale, mask and the
// online softmax in registers (attn_mask, attn_softmax: the accumulator's rows are mma.sync's),
// O += P V (wgmma, P from registers, V transposed from shared memory). Rows and keys past the
// tensors' ends load as zeros; the keys of the last tile past kv_len (or the causal limit of the
// block's last row) are zeroed in V, since a weight of 0 times a NaN there would be NaN.
// keys a tile, stages of the K/V ring, consumer warpgroups (NC). Dh 128 and 256: the widest tiles
// whose two stages of K and V fit beside Q (225 of the 227 KB), 192 and 80 keys (the scores take
// 96 of a consumer's 240 registers at Dh 128). Dh 64 runs three consumers
// (192 rows): its products are half as long a key as Dh 128's, and a third softmax in flight keeps
// the tensor cores fed; that leaves 160 registers a consumer: 128-key tiles fit, wider ones do not.
template <int D> struct AttnTmaPlan;
template <> struct AttnTmaPlan<64> { static constexpr int kBc = 128, kStages = 2, kWgs = 3; };
template <> struct AttnTmaPlan<128> { static constexpr int kBc = 192, kStages = 2, kWgs = 2; };
template <> struct AttnTmaPlan<256> { static constexpr int kBc = 80, kStages = 2, kWgs = 2; };

// shared-memory layout (bytes from a 1024-aligned base): Q, the K stages, the V stages, barriers
template <int D> struct AttnTmaSmem {
  static constexpr int kBc = AttnTmaPlan<D>::kBc, kStages = AttnTmaPlan<D>::kStages, kWgs = AttnTmaPlan<D>::kWgs;
  // query rows a block (64 a consumer), threads, and the registers a thread: the launch's (64 K
  // over the threads, a multiple of 8), the producer's, and the consumers': what the producer
  // gives up of the launch's, a multiple of 8 (setmaxnreg.inc waits for registers that a .dec
  // released: asking more than that hangs)
  static constexpr int kRows = 64 * kWgs, kThreads = 128 * (kWgs + 1), kLaunchRegs = 65536 / kThreads / 8 * 8,
                       kProdRegs = 24, kRegs = std::min(256, (kLaunchRegs * (kWgs + 1) - kProdRegs) / kWgs / 8 * 8);
  static_assert(kRegs * kWgs + kProdRegs <= kLaunchRegs * (kWgs + 1) && kRegs >= kLaunchRegs,
                "setmaxnreg: the consumers' registers come from those the producer releases");
  static constexpr uint32_t kQ = 0, kK = kQ + kRows * D * 2, kTile = kBc * D * 2, kV = kK + kStages * kTile,
                            kBars = kV + kStages * kTile, kItem = kBars + (2 + 4 * kStages) * 8,
                            kBytes = kItem + sizeof(AttnItem) + 1024;
};

#if FUSEDK__SM90A // the kernel's parts, device code of sm_90a builds alone
// The kernel's shared memory: tiles (Q, the K and V stages) and the barriers between producer
// and consumers: Q landed, Q released; per stage K landed, V landed, K released, V released
// (released: each consumer thread arrives); the producer's pick of the next item
struct AttnTmaRing {
  uint32_t sq, sk, sv;
  uint64_t *q_full, *q_free, *k_full, *v_full, *k_free, *v_free;
  AttnItem *item;
};
template <typename L> __device__ __forceinline__ AttnTmaRing attn_tma_ring(unsigned char *smem) {
  constexpr int ST = L::kStages;
  const uint32_t raw = smem_u32(smem), base = (raw + 1023) & ~1023u;
  uint64_t *bars = reinterpret_cast<uint64_t *>(smem + (base - raw) + L::kBars);
  AttnTmaRing R{base + L::kQ, base + L::kK, base + L::kV, bars, bars + 1, bars + 2, bars + 2 + ST, bars + 2 + 2 * ST,
                bars + 2 + 3 * ST, reinterpret_cast<AttnItem *>(smem + (base - raw) + L::kItem)};
  if (threadIdx.x == 0) {
    mbar_init(R.q_full, 1), mbar_init(R.q_free, 128 * L::kWgs);
    for (int s = 0; s < ST; ++s)
      mbar_init(&R.k_full[s], 1), mbar_init(&R.v_full[s], 1), mbar_init(&R.k_free[s], 128 * L::kWgs),
          mbar_init(&R.v_free[s], 128 * L::kWgs);
    fence_mbar_init();
  }
  return R;
}

// The producer (one thread): picks the items (attn_next) and hands each to the consumers with
// Q's barrier (load_q(blk) issues Q's loads); loads tile it's K into stage it % ST once tile it -
// ST's K is released (load_k(blk, j, s)), then its V (load_v). The K/V ring runs on across items
// (tile counter it), so the next item's first tiles load while the consumers finish this one; Q
// is reloaded once every consumer has issued the item's last S product. L: the layout (its
// rows, tile and stages).
template <typename L, typename LoadQ, typename LoadK, typename LoadV>
__device__ __forceinline__ void attn_ring_produce(const AttnTmaRing &R, const fusedk__attn_args &a, int n_mb,
                                                  const AttnSplit &sp, LoadQ &&load_q, LoadK &&load_k, LoadV &&load_v) {
  constexpr int BC = L::kBc, ST = L::kStages, BR = L::kRows;
  uint32_t it = 0; // a block's tiles stay below 2^32 (32 bits: one register of the producer's 24)
  for (int k = 0;; ++k) {
    const AttnItem wk = attn_next(sp, k);
    if (k) mbar_wait(R.q_free, (uint32_t)(k - 1) & 1);
    *R.item = wk; // the consumers read it once q_full completes: with Q, or past the last item without
    if (wk.u < 0) {
      mbar_arrive(R.q_full);
      return;
    }
    const AttnBlock blk(a, n_mb, BR, wk.u);
    const int je = wk.je < 0 ? (int)((blk.n_hi + BC - 1) / BC) : wk.je;
    load_q(blk);
    for (int j = wk.jb; j < je; ++j, ++it) {
      const int s = (int)(it % ST);
      const uint32_t ph = (uint32_t)(it / ST - 1) & 1;
      if (it >= ST) mbar_wait(&R.k_free[s], ph);
      load_k(blk, j, s);
      if (it >= ST) mbar_wait(&R.v_free[s], ph);
      load_v(blk, j, s);
    }
  }
}

// The bf16 / f16 kernel's loads: Q, K and V in boxes of 64 columns (128 bytes)
template <typename T, int D>
__device__ __forceinline__ void attn_tma_produce(const AttnTmaRing &R, const CUtensorMap &tq, const CUtensorMap &tk,
                                                 const CUtensorMap &tv, const fusedk__attn_args &a, int n_mb,
                                                 const AttnSplit &sp) {
  using L = AttnTmaSmem<D>;
  constexpr int BC = L::kBc, CB = D / 64, BR = L::kRows;
  attn_ring_produce<L>(
      R, a, n_mb, sp,
      [&](const AttnBlock &blk) {
        mbar_expect(R.q_full, BR * D * 2);
        for (int c = 0; c < CB; ++c)
          tma_load_4d(R.sq + c * BR * 128, &tq, 64 * c, (int)blk.i0, (int)blk.h, (int)blk.b, R.q_full);
      },
      [&](const AttnBlock &blk, int j, int s) {
        mbar_expect(&R.k_full[s], L::kTile);
        for (int c = 0; c < CB; ++c)
          tma_load_4d(R.sk + s * L::kTile + c * BC * 128, &tk, 64 * c, j * BC, (int)blk.hk, (int)blk.b, &R.k_full[s]);
      },
      [&](const AttnBlock &blk, int j, int s) {
        mbar_expect(&R.v_full[s], L::kTile);
        for (int c = 0; c < CB; ++c)
          tma_load_4d(R.sv + s * L::kTile + c * BC * 128, &tv, 64 * c, j * BC, (int)blk.hk, (int)blk.b, &R.v_full[s]);
      });
}

// A consumer's pipeline over one item's n_tiles key tiles (ring tiles it, it + 1, ...): iteration
// j issues S_j (scores) and O += P_{j-1} V_{j-1} (values) together, then runs tile j's softmax
// while the second product is still in the tensor cores (FA3's intra-warpgroup overlap); O's
// update (settle: rescale or add) and P_j's registers (pack) come only after that product is done
// (P_j packed any earlier, into registers of its own, makes ptxas serialize the products).
// turn / pass: the consumers' ping-pong around their issues. The steps, by the kernel: S's
// register type SR; k_ready(t): K's stage of ring tile t landed (before the turn: loads from it
// there wait on no product); scored(sc, t): S of ring tile t is done (before K's stage is
// released); v_ready(j, t): V of tile t (the item's j) landed and usable; hold(in): pins O's
// registers, and P's going in, around the products (wgmma_hold).
template <typename SR, int BC, int ST, typename Turn, typename Pass, typename KReady, typename Scores,
          typename Values, typename Scored, typename Softmax, typename VReady, typename Hold, typename Settle,
          typename Pack>
__device__ __forceinline__ void attn_pipeline(const AttnTmaRing &R, int jb, int n_tiles, int64_t it, Turn &&turn,
                                              Pass &&pass, KReady &&k_ready, Scores &&scores, Values &&values,
                                              Scored &&scored, Softmax &&softmax, VReady &&v_ready, Hold &&hold,
                                              Settle &&settle, Pack &&pack) {
  if (n_tiles == 0) mbar_arrive(R.q_free);
  if (n_tiles) {
    SR sc[BC / 8][4];
    mbar_wait(&R.k_full[it % ST], (uint32_t)(it / ST) & 1);
    k_ready(it);
    turn();
    wgmma_fence();
    scores(sc, it);
    pass();
    wgmma_wait<0>();
    wgmma_hold(sc);
    auto &sf = scored(sc, it);
    mbar_arrive(&R.k_free[it % ST]);
    if (n_tiles == 1) mbar_arrive(R.q_free); // the unit's last S product is done
    softmax(sf, jb);
    pack(sf);
  }
  for (int j = 1; j < n_tiles; ++j) {
    const int64_t t = it + j;
    SR sc[BC / 8][4];
    v_ready(jb + j - 1, t - 1);
    mbar_wait(&R.k_full[t % ST], (uint32_t)(t / ST) & 1);
    k_ready(t);
    hold(true); // O's update and P_{j-1} are in their registers before the products start
    turn();
    wgmma_fence();
    scores(sc, t);
    values(t - 1);
    pass();
    wgmma_wait<1>(); // S_j is done, P_{j-1} V_{j-1} may still run
    wgmma_hold(sc);
    auto &sf = scored(sc, t);
    mbar_arrive(&R.k_free[t % ST]);
    if (j == n_tiles - 1) mbar_arrive(R.q_free);
    softmax(sf, jb + j);
    wgmma_wait<0>(); // P_{j-1} V_{j-1} is done: P_j may take its registers, O tile j's update
    hold(false);
    mbar_arrive(&R.v_free[(t - 1) % ST]);
    settle();
    pack(sf);
  }
  if (n_tiles) {
    const int64_t t = it + n_tiles - 1;
    v_ready(jb + n_tiles - 1, t);
    hold(true);
    turn();
    wgmma_fence();
    values(t);
    pass();
    wgmma_wait<0>();
    hold(false);
    mbar_arrive(&R.v_free[t % ST]);
  }
}

// A consumer warpgroup's mainloop over one item's n_tiles key tiles (ring tiles it, it + 1, ...,
// the item's from jb): O, m, l of its 64 rows, on attn_pipeline: S = Q K^T (both from shared
// memory), the mask and online softmax, O's rescale where a row's max moved, P packed to T as
// the a operand of O += P V (V transposed from shared memory, its keys past the block's last
// zeroed).
// Wait for the 16-bit V stage of ring tile t (the unit's key tile j; stages `bytes` apart), then
// zero its keys past the block's last: keys no row of the block sees give 0, not whatever the
// tensor holds (past Sk TMA has zero-filled), so that a weight of 0 never meets an Inf; w's own
// barrier around the stores (the thread's index read there: kept in a register across the loop,
// ptxas spills it)
template <int BC, int D, int ST>
__device__ __forceinline__ void attn_v16_ready(const AttnTmaRing &R, uint32_t bytes, const fusedk__attn_args &a,
                                               const AttnBlock &blk, int j, int64_t t, int w) {
  constexpr int CH = D / 8;
  const int64_t j0 = (int64_t)j * BC;
  const uint32_t vt = R.sv + (int)(t % ST) * bytes;
  mbar_wait(&R.v_full[t % ST], (uint32_t)(t / ST) & 1);
  if (j0 + BC > blk.n_hi && blk.n_hi < a.Sk) {
    const int from = (int)(blk.n_hi - j0);
    for (int i = threadIdx.x % 128; i < (BC - from) * CH; i += 128)
      asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};" ::"r"(vt + swz128(BC, from + i / CH, i % CH)), "r"(0)
                   : "memory");
    fence_async_smem();
    bar_sync(1 + w, 128);
  }
}
// issue O += P V of the 16-bit V stage at vt (k steps of 16 keys: 16 rows of V, 64-column chunks BC * 128 bytes apart)
template <typename T, int D, int BC>
__device__ __forceinline__ void attn_pv16(float (&o)[D / 8][4], const uint32_t (&pa)[BC / 16][4], uint32_t vt) {
#pragma unroll
  for (int kk = 0; kk < BC / 16; ++kk) wgmma_rs<T, D>(o, pa[kk], wgmma_desc(vt + kk * 16 * 128, BC * 128, 1024), 1);
  wgmma_commit();
}

template <typename T, int D, typename Turn, typename Pass>
__device__ __forceinline__ void attn_tma_mainloop(const AttnTmaRing &R, const fusedk__attn_args &a,
                                                  const AttnBlock &blk, int jb, int n_tiles, int64_t it, int w,
                                                  int tid, float scale_log2, float (&o)[D / 8][4], float (&m)[2],
                                                  float (&l)[2], Turn &&turn, Pass &&pass) {
  using L = AttnTmaSmem<D>;
  constexpr int BC = L::kBc, ST = L::kStages, BR = L::kRows;
  const int lane = tid % 32, frag = 16 * (tid / 32) + lane / 4, c0 = 2 * (lane % 4);
  const int64_t r0 = blk.i0 + 64 * w; // the warpgroup's first row
  const int64_t lim[2] = {attn_keys(a, blk.kv, r0 + frag), attn_keys(a, blk.kv, r0 + frag + 8)};
  float alpha[2];
  uint32_t pa[BC / 16][4];
  auto scores = [&](float (&sc)[BC / 8][4], int64_t t) { // issue S of ring tile t (k steps of 16 columns: 32 bytes)
    const uint32_t kt = R.sk + (int)(t % ST) * L::kTile;
    auto qd = [&](int kk) { return wgmma_desc(R.sq + (kk / 4) * BR * 128 + w * 64 * 128 + (kk % 4) * 32, 16, 1024); };
    auto kd = [&](int kk) { return wgmma_desc(kt + (kk / 4) * BC * 128 + (kk % 4) * 32, 16, 1024); };
    wgmma_ss0<T, BC>(sc, qd(0), kd(0));
#pragma unroll
    for (int kk = 1; kk < D / 16; ++kk) wgmma_ss<T, BC>(sc, qd(kk), kd(kk), 1);
    wgmma_commit();
  };
  auto values = [&](int64_t t) { attn_pv16<T, D, BC>(o, pa, R.sv + (int)(t % ST) * L::kTile); };
  auto softmax = [&](float (&sc)[BC / 8][4], int j) { // tile j's weights; alpha for O
    const int64_t j0 = (int64_t)j * BC;
    attn_mask<BC>(sc, scale_log2, lim, j0, j0 + BC > blk.n_lo, c0);
    attn_softmax<BC>(sc, scale_log2, m, l, alpha);
  };
  attn_pipeline<float, BC, ST>(
      R, jb, n_tiles, it, turn, pass, [](int64_t) {}, scores, values,
      [](float (&sc)[BC / 8][4], int64_t) -> float(&)[BC / 8][4] { return sc; }, softmax,
      [&](int j, int64_t t) { attn_v16_ready<BC, D, ST>(R, L::kTile, a, blk, j, t, w); },
      [&](bool in) {
        wgmma_hold(o);
        if (in) wgmma_hold(pa);
      },
      [&] {
        attn_rescale_moved<D>(o, alpha);
      },
      [&](float (&sc)[BC / 8][4]) { pack_a<T, BC>(pa, sc); });
}

#endif // FUSEDK__SM90A

// Persistent: a block takes the items (units of 64 NC query rows of one (b, h), or pieces of
// them) its producer warpgroup picks; NC consumer warpgroups run the mainloop on them and store
// (the epilogue: whole units from registers, pieces through the split's buffer). Ping-pong: the
// consumers take turns, in order, to issue their products (named barriers NC + 1 + w, one per
// consumer, each passed by the one before it after its issue), so that one's softmax runs while
// another's products keep the tensor cores busy. Consumer 0 goes first: the last passes once
// before its first turn, and consumer 0 takes one turn more at the end to balance that.
// (Barriers 1..NC: each consumer's own, around V's zeroing.)
template <typename T, int D>
__global__ void __launch_bounds__(AttnTmaSmem<D>::kThreads, 1)
    attn_tma_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                    const __grid_constant__ CUtensorMap tv, const fusedk__attn_args a, int n_mb,
                    const __grid_constant__ AttnSplit sp,
                    float scale_log2) {
#if FUSEDK__SM90A
  using L = AttnTmaSmem<D>;
  constexpr int BC = L::kBc, NC = L::kWgs, BR = L::kRows;
  extern __shared__ __align__(1024) unsigned char attn_tma_smem[];
  const AttnTmaRing R = attn_tma_ring<AttnTmaSmem<D>>(attn_tma_smem);
  __syncthreads();
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (wg == 0) {
    regs_lower<L::kProdRegs>();
    if (tid == 0) attn_tma_produce<T, D>(R, tq, tk, tv, a, n_mb, sp);
    return;
  }
  regs_raise<L::kRegs>();
  const int w = wg - 1, frag = 16 * (tid / 32) + tid % 32 / 4;
  auto turn = [&] { bar_sync(1 + NC + w, 256); };
  auto pass = [&] { bar_arrive(1 + NC + (w + 1) % NC, 256); };
  if (w == NC - 1) bar_arrive(1 + NC, 256);
  int64_t it = 0; // the K/V tile counter, as the producer's
  for (int k = 0;; ++k) {
    mbar_wait(R.q_full, (uint32_t)k & 1); // the item's Q landed, and the producer's pick with it
    const AttnItem wk = *R.item;
    if (wk.u < 0) break;
    const AttnBlock blk(a, n_mb, BR, wk.u);
    const int n_tiles = (wk.je < 0 ? (int)((blk.n_hi + BC - 1) / BC) : wk.je) - wk.jb; // from key tile jb
    float o[D / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int t = 0; t < D / 8; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.f;
    attn_tma_mainloop<T, D>(R, a, blk, wk.jb, n_tiles, it, w, tid, scale_log2, o, m, l, turn, pass);
    it += n_tiles;
    const int64_t row = blk.i0 + 64 * w + frag;
    if (wk.slot < 0) attn_store_regs<T, D>(a, o, m, l, row, blk.b, blk.h, tid % 32);
    else attn_piece_store<T, D, NC>(a, sp, wk, o, m, l, w, tid, row, blk.b, blk.h);
  }
  if (w == 0) turn(); // the last consumer's last pass
#endif
}

constexpr int64_t kAttnSplitMin = 8; // tile steps a block the split must save (launch_attn_tma)

// the split launches' counters and partial results, a (device, stream)
StreamBuffers &attn_buffers() {
  static StreamBuffers *b = new StreamBuffers; // never destroyed: no teardown order at exit
  return *b;
}

// The Hopper kernels' grid and schedule (bf16 and int8) for `units` units of `tiles` key tiles
// each, NC consumers of D columns a block. Persistent, a block an SM. Units alike: a static round
// robin, the last wave's units split by keys where that saves the blocks at least kAttnSplitMin
// tile steps (tiles (1 - tail / sms); pieces cost their own Q loads, pipeline ramps and the
// merge, a few tiles: bench/NOTES.md). Work that varies (causal, kv_len): units from a counter
// (balanced as the hardware's block scheduler would, with the next unit's loads under this one's
// end). Without the buffer (no memory, too many streams): unsplit, or a block a unit.
template <int D, int NC>
cudaError_t attn_plan(const fusedk__attn_args &a, cudaStream_t s, int dev, int64_t units, int64_t tiles, int64_t &grid,
                      AttnSplit &sp) {
  const int64_t sms = device_sms(dev), tail = units % sms;
  const bool alike = !a.causal && !a.kv_len,
             split = alike && tail && tiles * (sms - tail) >= kAttnSplitMin * sms && tail * tiles >= sms &&
                     sms * tail * tiles < ((int64_t)1 << 31),
             dynamic = !alike && units > sms;
  grid = alike ? std::min(units, sms) : units;
  sp = AttnSplit{units, 0, 0, 0, nullptr, nullptr, nullptr};
  if (split || dynamic) {
    // the buffer: the unit counter, the pieces' counters (one size for every plan: up to 4
    // consumers of 4 warps a tail unit; the head sizes' launches share the buffer, and only the
    // counters are zeroed), the pieces' results
    static_assert(NC <= 4, "the split's counters: 16 a tail unit");
    const size_t counters = 64 + (size_t)sms * 16 * sizeof(int),
                 part = split ? (size_t)(2 * sms * NC * (D / 8 + 1) * 128) * sizeof(float4) : 0;
    void *ws = nullptr;
    const cudaError_t w = attn_buffers().get(dev, s, counters + part, counters, &ws);
    if (w != cudaSuccess && w != cudaErrorMemoryAllocation && w != cudaErrorLaunchOutOfResources) return w;
    if (w != cudaSuccess) {
      cudaGetLastError(); // not sticky
    } else if (split) {
      grid = sms, sp.full = units - tail, sp.waves = (int)(units / sms), sp.R = (int)tail, sp.T = (int)tiles;
      sp.cnt = (int *)((char *)ws + 64), sp.part = (float4 *)((char *)ws + counters);
    } else {
      grid = sms, sp.next = (unsigned long long *)ws;
    }
  }
  return cudaSuccess;
}

// The Hopper kernel when it applies: the device runs sm_90a code, FUSEDK_NO_TMA is unset, and
// TMA can describe q, k and v (16-byte aligned bases and strides; attn_vec). *used says.
template <typename T, int D>
cudaError_t launch_attn_tma(const fusedk__attn_args &a, cudaStream_t s, int dev, bool *used) {
  using L = AttnTmaSmem<D>;
  *used = false;
  if (tma_disabled() || !tma_code<attn_tma_kernel<T, D>>(dev) || L::kBytes > device_smem_optin(dev)) return cudaSuccess;
  constexpr bool bf = std::is_same<T, __nv_bfloat16>::value;
  CUtensorMap tq, tk, tv;
  if (!tmap_bshd(&tq, a.q.p, bf, a.B, a.Sq, a.Hq, a.Dh, a.q.sb, a.q.ss, a.q.sh, L::kRows) ||
      !tmap_bshd(&tk, a.k.p, bf, a.B, a.Sk, a.Hkv, a.Dh, a.k.sb, a.k.ss, a.k.sh, L::kBc) ||
      !tmap_bshd(&tv, a.v.p, bf, a.B, a.Sk, a.Hkv, a.Dh, a.v.sb, a.v.ss, a.v.sh, L::kBc))
    return cudaSuccess;
  const cudaError_t e = smem_opt_in<attn_tma_kernel<T, D>>(L::kBytes, 0, dev);
  if (e != cudaSuccess) return e;
  const int64_t n_mb = (a.Sq + L::kRows - 1) / L::kRows, units = n_mb * a.B * a.Hq;
  int64_t grid;
  AttnSplit sp;
  const cudaError_t w = attn_plan<D, L::kWgs>(a, s, dev, units, (a.Sk + L::kBc - 1) / L::kBc, grid, sp);
  if (w != cudaSuccess) return w;
  attn_tma_kernel<T, D><<<(unsigned)grid, L::kThreads, L::kBytes, s>>>(tq, tk, tv, a, (int)n_mb, sp,
                                                               a.scale * 1.4426950408889634f);
  *used = true;
  return cudaGetLastError();
}

// 16-byte rows: every base 16-byte aligned, every row stride and Dh a multiple of 8 elements
template <typename X> bool attn_rows16(const X &t) { // one [B, S, H, Dh] view's base and strides
  return aligned16(t.p) && t.sb % 8 == 0 && t.ss % 8 == 0 && t.sh % 8 == 0;
}
bool attn_vec(const fusedk__attn_args &a) {
  return a.Dh % 8 == 0 && attn_rows16(a.q) && attn_rows16(a.k) && attn_rows16(a.v) && attn_rows16(a.out);
}

template <typename T> cudaError_t launch_attention(const fusedk__attn_args &a, cudaStream_t s, int dev) {
  auto by_width = [&](auto vc) -> cudaError_t {
    constexpr bool V = decltype(vc)::value;
    return a.Dh <= 64    ? launch_attn<T, 64, typename AttnPlan<64>::type, V>(a, s, dev)
           : a.Dh <= 128 ? launch_attn<T, 128, typename AttnPlan<128>::type, V>(a, s, dev)
                         : launch_attn<T, 256, typename AttnPlan<256>::type, V>(a, s, dev);
  };
  if (!attn_vec(a)) return by_width(std::false_type{});
  bool used; // Hopper: the TMA kernel where it applies
  const cudaError_t e = a.Dh <= 64    ? launch_attn_tma<T, 64>(a, s, dev, &used)
                        : a.Dh <= 128 ? launch_attn_tma<T, 128>(a, s, dev, &used)
                                      : launch_attn_tma<T, 256>(a, s, dev, &used);
  return used || e != cudaSuccess ? e : by_width(std::true_type{});
}

// ---------------------------------------------------------------------------------------------
// attention_int8: q and k quantized (fusedk.h's rules) into a per-stream buffer by two passes,
// then the Hopper kernel's schedule with S = Q K^T on integer tensor cores. The passes:
// statistics (k's sums per chunk of keys, then summed once a (b, head) in chunk order: the same
// bits run to run) and rows (q and k, a warp a row: int8 and a float scale; q's row also gets
// scale * q . mean(k), lse's part). The kernel: S as s8 x s8 -> s32, to float times k's scales
// (q's join in the exponent); the online softmax; P in the inputs' 16-bit type against the
// running max and O += P V on 16-bit tensor cores from v as given (the bf16 kernel's V stages):
// SageAttention's split, since 8 bits of P (or of v) cost more accuracy than the op's error
// contract allows. Head sizes 64, 128 and 256 (rows of D bytes).
// ---------------------------------------------------------------------------------------------
constexpr int kI8Bc = 128;        // keys a tile
constexpr int kI8StatRows = 256;  // keys a statistics block

// The buffer: q8 [B, Hq, Sq, D], k8 [B, Hk, Sk, D] (int8), qs and qm [B, Hq, Sq], ks [B, Hk, Skp]
// (float2: k's scale, times the sign of the softmax scale, and -1.5 2^23 times that:
// attn_i8_mainloop's conversion), the statistics' partial sums [B Hk, TS, D] and k's mean [B Hk,
// D]; v16 [B, Sk, Hk, D] (T): v's copy where TMA cannot read v itself (a base or stride not a
// 16-byte multiple, a stride 0 (broadcast) or negative), else none. attention_int8_scaled (q and
// k given in int8): qs and ks alone.
struct AttnI8Buf {
  int64_t Skp, TS;
  size_t q8, k8, qs, qm, ks, part, mean, v16, bytes;
  AttnI8Buf(const fusedk__attn_args &a, bool copy_v) {
    const int64_t D = a.Dh, bh = a.B * a.Hkv, bq = a.B * a.Hq, own = a.scaled ? 0 : 1;
    Skp = (a.Sk + kI8Bc - 1) / kI8Bc * kI8Bc, TS = (a.Sk + kI8StatRows - 1) / kI8StatRows;
    size_t at = 0;
    auto take = [&](int64_t n) { const size_t p = at; at += ((size_t)n + 255) / 256 * 256; return p; };
    q8 = take(own * bq * a.Sq * D), k8 = take(own * bh * a.Sk * D), qs = take(bq * a.Sq * 4),
    qm = take(own * bq * a.Sq * 4), ks = take(bh * Skp * 8), part = take(own * bh * TS * D * 4),
    mean = take(own * bh * D * 4), v16 = take(copy_v ? bh * a.Sk * D * 2 : 0);
    bytes = at;
  }
};

StreamBuffers &attn_i8_buffers() {
  static StreamBuffers *b = new StreamBuffers; // never destroyed: no teardown order at exit
  return *b;
}

// k's pair for attn_i8_mainloop's conversion of S's sums: its scale with the softmax scale's sign,
// cut to 22 bits (1.5 2^23 times it exact: a sum of 0 a score of exactly 0), and -1.5 2^23 times that
__device__ __forceinline__ float2 attn_i8_kpair(float scale, const fusedk__attn_args &a) {
  const float c = __uint_as_float(__float_as_uint(a.scale < 0.f ? -scale : scale) & ~3u);
  return make_float2(c, -12582912.f * c);
}

// The passes' grids are 1-D (blocks past 65535 (b, h) pairs): block x is chunk x % n of pair x / n
__device__ __forceinline__ void attn_i8_block(int64_t n, int64_t &bh, int64_t &chunk) {
  bh = blockIdx.x / n, chunk = blockIdx.x % n;
}

// Statistics: block (chunk, b hk) of 256 threads, thread (d, g): k's sum over the chunk's keys g,
// g + G, ... below the batch's count (G = 256 / D groups, their loads in flight together), the
// groups then summed in order
template <typename T, int D>
__global__ void __launch_bounds__(256) attn_i8_stats(const fusedk__attn_args a, float *part, int64_t TS) {
  constexpr int G = 256 / D;
  __shared__ float red[G][D];
  int64_t bh, ts;
  attn_i8_block(TS, bh, ts);
  const int64_t b = bh / a.Hkv, hk = bh % a.Hkv, j0 = ts * kI8StatRows;
  const int n = (int)min(attn_kv(a, b) - j0, (int64_t)kI8StatRows), d = threadIdx.x % D, g = threadIdx.x / D;
  const T *k = (const T *)a.k.p + b * a.k.sb + hk * a.k.sh + j0 * a.k.ss + d;
  float sum = 0.f;
#pragma unroll 4
  for (int j = g; j < n; j += G) sum += to_f32<T>(k[j * a.k.ss]);
  red[g][d] = sum;
  __syncthreads();
  if (g) return;
  for (int e = 1; e < G; ++e) sum += red[e][d];
  part[(bh * TS + ts) * D + d] = sum;
}

// k's mean: block b hk, thread d: the chunks' sums in order over the batch's count
__global__ void attn_i8_stat_sums(const fusedk__attn_args a, const AttnI8Buf L, unsigned char *buf) {
  const int64_t bh = blockIdx.x, D = a.Dh, n = attn_kv(a, bh / a.Hkv), chunks = (n + kI8StatRows - 1) / kI8StatRows;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    const float *p = (const float *)(buf + L.part) + bh * L.TS * D + d;
    float r = 0.f;
    for (int64_t t = 0; t < chunks; ++t) r += p[t * D];
    ((float *)(buf + L.mean))[bh * D + d] = n ? r / (float)n : 0.f;
  }
}

// Rows of q (K false) or k (K true): block (32 rows, b h), a warp 4 rows, a lane D / 32
// channels. k: its mean off, rows past the batch's count scale 0 (the last block zeroes ks's
// padding to Skp); q: qm = scale * sum q8 qs mean
template <typename T, int D, bool K>
__global__ void __launch_bounds__(256) attn_i8_rows(const fusedk__attn_args a, const AttnI8Buf L, unsigned char *buf) {
  constexpr int E = D / 32;
  __shared__ float mean[D];
  const int64_t H = K ? a.Hkv : a.Hq, S = K ? a.Sk : a.Sq;
  int64_t bh, chunk;
  attn_i8_block((S + 31) / 32, bh, chunk);
  const int64_t b = bh / H, h = bh % H;
  const int64_t hk = K ? h : h / (a.Hq / a.Hkv), n = attn_kv(a, b);
  for (int d = threadIdx.x; d < D; d += blockDim.x) mean[d] = ((const float *)(buf + L.mean))[(b * a.Hkv + hk) * D + d];
  if (K && chunk == (S + 31) / 32 - 1)
    for (int64_t j = S + threadIdx.x; j < L.Skp; j += blockDim.x) ((float2 *)(buf + L.ks))[bh * L.Skp + j] = make_float2(0.f, 0.f);
  __syncthreads();
  const int lane = threadIdx.x % 32, d0 = E * lane;
  const auto &src = K ? a.k : a.q;
  for (int r = 0; r < 4; ++r) {
    const int64_t i = chunk * 32 + threadIdx.x / 32 * 4 + r;
    if (i >= S) break;
    float x[E], m = 0.f;
    const T *p = (const T *)src.p + b * src.sb + i * src.ss + h * src.sh + d0;
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = to_f32<T>(p[e]) - (K ? mean[d0 + e] : 0.f), m = amax_nan(m, x[e]);
    for (int o = 16; o; o >>= 1) m = amax_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float inv = q_inv<127>(m), scale = m / 127.f;
    uint64_t bytes = 0;
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int q = i8_of(x[e], inv);
      bytes |= (uint64_t)(q & 255) << 8 * e, dot += (float)q * mean[d0 + e];
    }
    const int64_t row = bh * S + i;
    unsigned char *dst = buf + (K ? L.k8 : L.q8) + row * D + d0;
    if constexpr (E == 8) *(uint64_t *)dst = bytes;
    else if constexpr (E == 4) *(uint32_t *)dst = (uint32_t)bytes;
    else *(uint16_t *)dst = (uint16_t)bytes;
    if (K) {
      if (lane == 0) ((float2 *)(buf + L.ks))[bh * L.Skp + i] = attn_i8_kpair(i < n ? scale : 0.f, a);
    } else {
      for (int o = 16; o; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      if (lane == 0) ((float *)(buf + L.qs))[row] = scale, ((float *)(buf + L.qm))[row] = a.scale * scale * dot;
    }
  }
}

// attention_int8_scaled's scales, their magnitudes, into the kernel's forms, the grid striding
// over them: qs [B, Hq, Sq] and k's pairs as attn_i8_rows writes them (keys past the batch's
// count and the padding to Skp: 0); no qm (no mean taken off k)
__global__ void __launch_bounds__(256) attn_i8_scales(const fusedk__attn_args a, const AttnI8Buf L,
                                                      unsigned char *buf) {
  const int64_t nq = a.B * a.Hq * a.Sq, nk = a.B * a.Hkv * L.Skp;
  for (int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x; i < nq + nk; i += (int64_t)gridDim.x * 256) {
    if (i < nq) {
      const int64_t b = i / (a.Hq * a.Sq), h = i / a.Sq % a.Hq, s = i % a.Sq;
      ((float *)(buf + L.qs))[i] = fabsf(a.qs.p[b * a.qs.sb + s * a.qs.ss + h * a.qs.sh]);
      continue;
    }
    const int64_t r = i - nq, b = r / (a.Hkv * L.Skp), h = r / L.Skp % a.Hkv, j = r % L.Skp;
    const float sc = j < attn_kv(a, b) ? fabsf(a.ks.p[b * a.ks.sb + j * a.ks.ss + h * a.ks.sh]) : 0.f;
    ((float2 *)(buf + L.ks))[r] = attn_i8_kpair(sc, a);
  }
}

// v's compact copy (AttnI8Buf's v16) where TMA cannot read v: a thread 8 channels of a row, the
// grid striding over the rest
template <typename T, int D>
__global__ void __launch_bounds__(256) attn_i8_vcopy(const fusedk__attn_args a, T *dst) {
  const int64_t n = a.B * a.Sk * a.Hkv * (D / 8);
  for (int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x; i < n; i += (int64_t)gridDim.x * 256) {
    const int64_t row = i / (D / 8), d0 = i % (D / 8) * 8, b = row / (a.Sk * a.Hkv), j = row / a.Hkv % a.Sk,
                  hk = row % a.Hkv;
    const T *src = (const T *)a.v.p + b * a.v.sb + j * a.v.ss + hk * a.v.sh + d0;
#pragma unroll
    for (int e = 0; e < 8; ++e) dst[row * D + d0 + e] = src[e];
  }
}

// The int8 kernel's shared memory (bytes from a 1024-aligned base): Q (64 NC rows of D bytes),
// the K stages (kBc rows of D bytes), the V stages (the bf16 kernel's: [kBc keys, D] of T in
// 64-column chunks), k's scales a stage (kBc float2s), then the barriers and the item as
// AttnTmaSmem's. Three stages: S takes half the bf16 kernel's time, so one more is in flight.
// Rows of Q and K in chunks of kCw bytes (kCw rows of 128 bytes for D 256; TMA's swizzled boxes
// are 128 bytes wide at most): rows of 64 bytes (D 64) take the 64-byte swizzle (kSwz: the
// descriptors' mode). D 256: tiles of 64 keys (O's 128 registers a thread leave room for 32 of S).
template <int D> struct AttnI8Smem {
  static constexpr int kBc = D == 256 ? 64 : kI8Bc, kCw = D < 128 ? D : 128, kStages = 3, kWgs = 2,
                       kRows = 64 * kWgs, kThreads = 128 * (kWgs + 1), kLaunchRegs = 65536 / kThreads / 8 * 8,
                       kProdRegs = 24, kRegs = std::min(256, (kLaunchRegs * (kWgs + 1) - kProdRegs) / kWgs / 8 * 8);
  static_assert(kI8Bc % kBc == 0, "k's scales are padded to kI8Bc keys");
  static constexpr uint64_t kSwz = D == 64 ? 2 : 1;
  static constexpr uint32_t kTile = kBc * D, kTileV = 2 * kTile, kQ = 0, kK = kQ + kRows * D,
                            kV = kK + kStages * kTile, kS = kV + kStages * kTileV, kBars = kS + kStages * kBc * 8,
                            kItem = kBars + (2 + 4 * kStages) * 8, kBytes = kItem + sizeof(AttnItem) + 1024;
};
// the int8 kernel's scales, from the buffer (qm, lse's q . mean(k): none where no mean is taken
// off); whether out's rows take 4-byte stores
struct AttnI8Scales {
  const float *qs, *qm;
  const float2 *ks;
  int64_t Skp;
  bool pairs;
};

#if FUSEDK__SM90A
__device__ __forceinline__ float4 lds_f4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
  return v;
}

// The int8 kernel's online softmax on k-scaled scores y (S's sums times k's scale a column;
// masked: -inf): row hf's scores are y qc[hf] (q's scale times scale log2(e), > 0: the scale's
// sign rides on k's); the weights 2^(y qc - m) replace y (P V takes them in 16 bits), l their sum.
// The running max m moves only where a tile's top passes it by more than 8 (O and l grow at most
// 2^8 meanwhile; alpha, 1 elsewhere, is then their factor), and whether it does needs the row's
// top (a max over its quad) only where a score of the thread's own passes m + 8: a warp vote
// keeps the shuffles' latency off the common path. A row that has seen only masked keys keeps
// m = -inf (its shift 0: no inf - inf).
template <int BC>
__device__ __forceinline__ void attn_i8_softmax(float (&y)[BC / 8][4], const float (&qc)[2], float (&m)[2],
                                                float (&l)[2], float (&alpha)[2]) {
  float x[2];
  bool up = false;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    x[hf] = fmaxf(y[0][2 * hf], y[0][2 * hf + 1]);
#pragma unroll
    for (int t = 1; t < BC / 8; ++t) x[hf] = fmaxf(x[hf], fmaxf(y[t][2 * hf], y[t][2 * hf + 1]));
    up |= x[hf] * qc[hf] > m[hf] + 8.f;
  }
  alpha[0] = alpha[1] = 1.f;
  if (__any_sync(0xffffffffu, up))
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float top = quad_max(x[hf]) * qc[hf];
      if (top > m[hf] + 8.f) alpha[hf] = exp2_ftz(m[hf] - top), m[hf] = top;
    }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    l[hf] *= alpha[hf];
    const float sh = m[hf] == -INFINITY ? 0.f : m[hf];
#pragma unroll
    for (int t = 0; t < BC / 8; ++t) {
      y[t][2 * hf] = exp2_ftz(fmaf(y[t][2 * hf], qc[hf], -sh));
      y[t][2 * hf + 1] = exp2_ftz(fmaf(y[t][2 * hf + 1], qc[hf], -sh));
      l[hf] += y[t][2 * hf] + y[t][2 * hf + 1];
    }
  }
}

// The int8 kernel's loads (attn_ring_produce): Q, K with k's scales (one bulk copy on K's
// barrier) from the buffer, boxes of kCw bytes; V from the tensor (or its copy) as the bf16
// kernel loads it (64-column boxes)
template <int D>
__device__ __forceinline__ void attn_i8_produce(const AttnTmaRing &R, unsigned char *sbase, const CUtensorMap &tq,
                                                const CUtensorMap &tk, const CUtensorMap &tv, const AttnI8Scales &sc,
                                                const fusedk__attn_args &a, int n_mb, const AttnSplit &sp) {
  using L = AttnI8Smem<D>;
  constexpr int BC = L::kBc, BR = L::kRows, CW = L::kCw;
  attn_ring_produce<L>(
      R, a, n_mb, sp,
      [&](const AttnBlock &blk) {
        mbar_expect(R.q_full, BR * D);
        for (int c = 0; c < D / CW; ++c)
          tma_load_4d(R.sq + c * BR * CW, &tq, c * CW, (int)blk.i0, (int)blk.h, (int)blk.b, R.q_full);
      },
      [&](const AttnBlock &blk, int j, int s) {
        mbar_expect(&R.k_full[s], L::kTile + BC * 8);
        for (int c = 0; c < D / CW; ++c)
          tma_load_4d(R.sk + s * L::kTile + c * BC * CW, &tk, c * CW, j * BC, (int)blk.hk, (int)blk.b, &R.k_full[s]);
        bulk_copy(sbase + L::kS + s * BC * 8, sc.ks + (blk.b * a.Hkv + blk.hk) * sc.Skp + (int64_t)j * BC, BC * 8,
                  &R.k_full[s]);
      },
      [&](const AttnBlock &blk, int j, int s) {
        mbar_expect(&R.v_full[s], L::kTileV);
        for (int c = 0; c < D / 64; ++c)
          tma_load_4d(R.sv + s * L::kTileV + c * BC * 128, &tv, 64 * c, j * BC, (int)blk.hk, (int)blk.b, &R.v_full[s]);
      });
}

// A consumer's mainloop over one item, on attn_pipeline (attn_tma_mainloop's schedule): S's int32
// sums become k-scaled scores before K's stage is released (k's scales loaded before the turn:
// shared loads issued among the products wait for them); P as T, O += P V in the float
// accumulator as the bf16 kernel's (attn_pv16), O's rescale where a row's max moved.
template <typename T, int D, typename Turn, typename Pass>
__device__ __forceinline__ void attn_i8_mainloop(const AttnTmaRing &R, uint32_t sks, const fusedk__attn_args &a,
                                                 const AttnBlock &blk, int jb, int n_tiles, int64_t it, int w, int tid,
                                                 const float (&qs)[2], float scale_log2, float (&o)[D / 8][4],
                                                 float (&m)[2], float (&l)[2], Turn &&turn, Pass &&pass) {
  using L = AttnI8Smem<D>;
  constexpr int BC = L::kBc, ST = L::kStages, CW = L::kCw;
  const int lane = tid % 32, frag = 16 * (tid / 32) + lane / 4, c0 = 2 * (lane % 4);
  const int64_t r0 = blk.i0 + 64 * w;
  const int64_t lim[2] = {attn_keys(a, blk.kv, r0 + frag), attn_keys(a, blk.kv, r0 + frag + 8)};
  float qc[2], alpha[2] = {1.f, 1.f};
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) { // a row of q 0 (all its scores 0) keeps -inf's keys -inf
    qc[hf] = qs[hf] * fabsf(scale_log2);
    qc[hf] = qc[hf] < 1e-30f ? 1e-30f : qc[hf];
  }
  uint32_t pa[BC / 16][4];
  float4 kq[BC / 8]; // k's (scale, offset) pairs of the thread's columns
  auto k_ready = [&](int64_t t) {
#pragma unroll
    for (int u = 0; u < BC / 8; ++u) kq[u] = lds_f4(sks + (int)(t % ST) * BC * 8 + (8 * u + c0) * 8);
  };
  auto scores = [&](int (&si)[BC / 8][4], int64_t t) { // S of ring tile t: k steps of 32 bytes
    const uint32_t kt = R.sk + (int)(t % ST) * L::kTile;
#pragma unroll
    for (int kk = 0; kk < D / 32; ++kk) {
      const int c = kk * 32 / CW, at = kk * 32 % CW; // the step's chunk, its offset in the rows
      wgmma_i8_ss<BC>(si, wgmma_desc(R.sq + c * L::kRows * CW + w * 64 * CW + at, 16, 8 * CW, L::kSwz),
                      wgmma_desc(kt + c * BC * CW + at, 16, 8 * CW, L::kSwz), kk > 0);
    }
    wgmma_commit();
  };
  // S's sums as k-scaled scores, in place: a sum plus 1.5 2^23, read as a float, is 1.5 2^23 +
  // the sum exactly (|sum| < 2^22), and one FFMA with k's (scale, -1.5 2^23 scale) takes it off
  // (the scale has 22 bits: the second term is exact)
  auto to_scores = [&](int (&si)[BC / 8][4], int64_t) -> float(&)[BC / 8][4] {
#pragma unroll
    for (int u = 0; u < BC / 8; ++u)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        si[u][e] = __float_as_int(
            fmaf(__int_as_float(si[u][e] + 0x4B400000), e & 1 ? kq[u].z : kq[u].x, e & 1 ? kq[u].w : kq[u].y));
    return reinterpret_cast<float(&)[BC / 8][4]>(si);
  };
  auto softmax = [&](float (&y)[BC / 8][4], int j) {
    const int64_t j0 = (int64_t)j * BC;
    attn_mask<BC>(y, 1.f, lim, j0, j0 + BC > blk.n_lo, c0);
    attn_i8_softmax<BC>(y, qc, m, l, alpha);
  };
  attn_pipeline<int, BC, ST>(
      R, jb, n_tiles, it, turn, pass, k_ready, scores,
      [&](int64_t t) { attn_pv16<T, D, BC>(o, pa, R.sv + (int)(t % ST) * L::kTileV); }, to_scores, softmax,
      [&](int j, int64_t t) { attn_v16_ready<BC, D, ST>(R, L::kTileV, a, blk, j, t, w); },
      [&](bool in) {
        wgmma_hold(o);
        if (in) wgmma_hold(pa);
      },
      [&] { attn_rescale_moved<D>(o, alpha); }, [&](float (&y)[BC / 8][4]) { pack_a<T, BC>(pa, y); });
}
#endif // FUSEDK__SM90A

// Persistent, as attn_tma_kernel (its items, ping-pong and producer), on the int8 buffer; the
// epilogue adds scale * q . mean(k) to lse.
template <typename T, int D>
__global__ void __launch_bounds__(AttnI8Smem<D>::kThreads, 1)
    attn_i8_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                   const __grid_constant__ CUtensorMap tv, const fusedk__attn_args a, const AttnI8Scales sc, int n_mb,
                   const __grid_constant__ AttnSplit sp, float scale_log2) {
#if FUSEDK__SM90A
  using L = AttnI8Smem<D>;
  constexpr int NC = L::kWgs, BR = L::kRows;
  extern __shared__ __align__(1024) unsigned char attn_i8_smem[];
  const AttnTmaRing R = attn_tma_ring<L>(attn_i8_smem);
  const uint32_t raw = smem_u32(attn_i8_smem), base = (raw + 1023) & ~1023u;
  __syncthreads();
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (wg == 0) {
    regs_lower<L::kProdRegs>();
    if (tid == 0) attn_i8_produce<D>(R, attn_i8_smem + (base - raw), tq, tk, tv, sc, a, n_mb, sp);
    return;
  }
  regs_raise<L::kRegs>();
  const int w = wg - 1, lane = tid % 32, frag = 16 * (tid / 32) + lane / 4;
  auto turn = [&] { bar_sync(1 + NC + w, 256); };
  auto pass = [&] { bar_arrive(1 + NC + (w + 1) % NC, 256); };
  if (w == NC - 1) bar_arrive(1 + NC, 256);
  int64_t it = 0;
  for (int k = 0;; ++k) {
    mbar_wait(R.q_full, (uint32_t)k & 1);
    const AttnItem wk = *R.item;
    if (wk.u < 0) break;
    const AttnBlock blk(a, n_mb, BR, wk.u);
    const int n_tiles = (wk.je < 0 ? (int)((blk.n_hi + L::kBc - 1) / L::kBc) : wk.je) - wk.jb;
    const int64_t row = blk.i0 + 64 * w + frag, qrow = (blk.b * a.Hq + blk.h) * a.Sq + row;
    const float qs[2] = {row < a.Sq ? sc.qs[qrow] : 0.f, row + 8 < a.Sq ? sc.qs[qrow + 8] : 0.f};
    float o[D / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int t = 0; t < D / 8; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.f;
    attn_i8_mainloop<T, D>(R, base + L::kS, a, blk, wk.jb, n_tiles, it, w, tid, qs, scale_log2, o, m, l, turn, pass);
    it += n_tiles;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      if (sc.qm && row + 8 * hf < a.Sq) m[hf] += sc.qm[qrow + 8 * hf] * 1.4426950408889634f; // log2 units
    if (wk.slot < 0) attn_store_regs<T, D>(a, o, m, l, row, blk.b, blk.h, lane, sc.pairs);
    else attn_piece_store<T, D, NC>(a, sp, wk, o, m, l, w, tid, row, blk.b, blk.h, sc.pairs);
  }
  if (w == 0) turn();
#endif
}

// attention_int8 on the GPU: the buffer, the two passes (and v's copy where TMA cannot read v),
// the kernel (Dh 64, 128 and 256, sm_90a: fusedk.h and fusedk__cuda_attention check)
template <typename T, int D>
cudaError_t launch_attention_i8(const fusedk__attn_args &a, cudaStream_t s, int dev) {
  using L = AttnI8Smem<D>;
  constexpr bool bf = std::is_same<T, __nv_bfloat16>::value;
  CUtensorMap tq, tk, tv;
  const bool copy_v = !tmap_bshd(&tv, a.v.p, bf, a.B, a.Sk, a.Hkv, D, a.v.sb, a.v.ss, a.v.sh, L::kBc);
  const AttnI8Buf B(a, copy_v);
  void *ws = nullptr;
  cudaError_t e = attn_i8_buffers().get(dev, s, B.bytes, 0, &ws);
  if (e != cudaSuccess) return e;
  unsigned char *buf = (unsigned char *)ws;
  const int64_t bh = a.B * a.Hkv;
  if (a.scaled) {
    const int64_t n = a.B * a.Hq * a.Sq + bh * B.Skp;
    attn_i8_scales<<<(unsigned)std::min<int64_t>((n + 255) / 256, 1 << 20), 256, 0, s>>>(a, B, buf);
  } else {
    attn_i8_stats<T, D><<<(unsigned)(B.TS * bh), 256, 0, s>>>(a, (float *)(buf + B.part), B.TS);
    attn_i8_stat_sums<<<(unsigned)bh, 256, 0, s>>>(a, B, buf);
    attn_i8_rows<T, D, false><<<(unsigned)((a.Sq + 31) / 32 * a.B * a.Hq), 256, 0, s>>>(a, B, buf);
    attn_i8_rows<T, D, true><<<(unsigned)((a.Sk + 31) / 32 * bh), 256, 0, s>>>(a, B, buf);
  }
  if (copy_v)
    attn_i8_vcopy<T, D><<<(unsigned)std::min<int64_t>((bh * a.Sk * (D / 8) + 255) / 256, 1 << 20), 256, 0, s>>>(
        a, (T *)(buf + B.v16));
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  // q8, k8: the buffer's [B, H, S, D], or (scaled) the caller's [B, S, H, D] as they lie
  const int64_t dq[4] = {D, a.Sq, a.Hq, a.B}, dk[4] = {D, a.Sk, a.Hkv, a.B};
  const int64_t sq[3] = {a.scaled ? a.q.ss : D, a.scaled ? a.q.sh : a.Sq * D, a.scaled ? a.q.sb : a.Hq * a.Sq * D};
  const int64_t sk[3] = {a.scaled ? a.k.ss : D, a.scaled ? a.k.sh : a.Sk * D, a.scaled ? a.k.sb : a.Hkv * a.Sk * D};
  const void *q8 = a.scaled ? a.q.p : buf + B.q8, *k8 = a.scaled ? a.k.p : buf + B.k8;
  constexpr CUtensorMapDataType u8 = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  constexpr CUtensorMapSwizzle swz = D == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B;
  if (!tmap_4d(&tq, q8, u8, dq, sq, L::kCw, L::kRows, swz) || !tmap_4d(&tk, k8, u8, dk, sk, L::kCw, L::kBc, swz) ||
      (copy_v && !tmap_bshd(&tv, buf + B.v16, bf, a.B, a.Sk, a.Hkv, D, a.Sk * a.Hkv * D, a.Hkv * D, D, L::kBc)))
    return cudaErrorInvalidValue;
  if ((e = smem_opt_in<attn_i8_kernel<T, D>>(L::kBytes, 0, dev)) != cudaSuccess) return e;
  const int64_t n_mb = (a.Sq + L::kRows - 1) / L::kRows, units = n_mb * a.B * a.Hq;
  int64_t grid;
  AttnSplit sp;
  if ((e = attn_plan<D, L::kWgs>(a, s, dev, units, B.Skp / L::kBc, grid, sp)) != cudaSuccess) return e;
  const bool pairs = ((uintptr_t)a.out.p & 3) == 0 && a.out.sb % 2 == 0 && a.out.ss % 2 == 0 && a.out.sh % 2 == 0;
  const AttnI8Scales sc{(const float *)(buf + B.qs), a.scaled ? nullptr : (const float *)(buf + B.qm),
                        (const float2 *)(buf + B.ks), B.Skp, pairs};
  attn_i8_kernel<T, D><<<(unsigned)grid, L::kThreads, L::kBytes, s>>>(tq, tk, tv, a, sc, (int)n_mb, sp,
                                                                       a.scale * 1.4426950408889634f);
  return cudaGetLastError();
}
#endif // FUSEDK__PART_ATTENTION

#if FUSEDK__PART_LINEAR || FUSEDK__PART_LOWRANK
// ---------------------------------------------------------------------------------------------
// [lowrank] lowrank_update, linear_lowrank's [x | h] and their backward, over two build parts:
// the linear part routes (linear_lowrank's splits, the backward's GEMM path or the one-pass
// kernel), the lowrank part runs the kernels; the shapes below are both parts' (each part reads
// some of them only: 177 off here, as for the shared helpers).
// ---------------------------------------------------------------------------------------------
#if !FUSEDK__PART_ALL
#pragma nv_diag_suppress 177
#endif

// linear_lowrank's [x | h] pass on tensor cores: where its 64-row blocks fill at most 3/4 of the
// SMs, k splits of them (each a share of x's 64-wide k tiles, at least 4) to give every SM a block;
// past that the splits' second pass and partial sums cost more than the SMs they fill. Its linear
// part sizes the partial sums' buffer by the same count.
inline int lr_cat_splits(int64_t M, int64_t K1, int dev) {
  const int64_t rows = (M + 63) / 64, tiles = (K1 + 63) / 64, sms = device_sms(dev);
  return (int)std::max<int64_t>(1, std::min((tiles + 3) / 4, 4 * rows <= 3 * sms ? (sms + rows - 1) / rows : 1));
}

// The tensor-core kernels' shapes: rows a block, x's k tile, out's column tile; stages of each
// ring (rank 16: five tiles in flight; wider ranks' v and u_t tiles would cost blocks an SM:
// three); warps a 16-row group (the partial h of WS warps fit the ring's bytes: 4 WS 32 RT / 8
// float4)
constexpr int kLrRows = 64, kLrK = 64, kLrN = 64;
template <int RT> constexpr int kLrStages = RT <= 16 ? 6 : 4;
template <int RT> constexpr int kLrShares = RT <= 64 ? 2 : 1;

// a ring of ST [64, W] + [W, RT] stages, then z [64, RT], dx's room [64, W] and the share sums' floats
template <int RT, int WS, int W, int ST> struct LgSmem {
  static constexpr int kX = kLrRows * W * 2, kStage = kX + W * RT * 2, kZ = ST * kStage, kO = kZ + kLrRows * RT * 2,
                       kSum = kO + kLrRows * W * 2, kBytes = kSum + (WS > 1 ? 4 * kLrRows * WS * RT : 0);
};

// the backward's one-pass kernel: 128-wide tiles (64 at rank 128: registers), rings of six
// stages at rank 16, else four
template <int RT> struct LgPlan {
  static constexpr int WS = kLrShares<RT>, W = RT <= 64 ? 128 : 64, ST = RT <= 16 ? 6 : 4;
  using L = LgSmem<RT, WS, W, ST>;
};
inline int lg_smem(int r) {
  return r <= 16 ? LgPlan<16>::L::kBytes : r <= 32 ? LgPlan<32>::L::kBytes : r <= 64 ? LgPlan<64>::L::kBytes
                                                                                    : LgPlan<128>::L::kBytes;
}

// 16-byte rows: the tensor-core low-rank kernels' copies
inline bool lr_vec(const fusedk__mat &m) { return (uintptr_t)m.p % 16 == 0 && m.ld % 8 == 0; }

// The backward's one-pass kernel takes the call: 16-bit, K and N multiples of 8, 16-byte rows of
// x, dy (dz), u_t or w_cat and dx; for linear_lowrank one adapter and 16-byte rows of a; 64-row
// blocks for at least 3/4 of the SMs (fewer leave it slower than the GEMMs, which split k); and
// its shared memory within what the device gives a block.
inline bool lowrank_grad_fits(const fusedk__lowrank_grad_args &a, int dev) {
  return a.scalar != FUSEDK_F32 && a.M > 0 && a.K > 0 && a.N > 0 && a.K % 8 == 0 && a.N % 8 == 0 && lr_vec(a.x) &&
         lr_vec(a.dy) && lr_vec(a.q) && (!a.dx.p || lr_vec(a.dx)) && (!a.lora || (a.slots == 1 && lr_vec(a.p))) &&
         4 * ((a.M + 63) / 64) >= 3 * (int64_t)device_sms(dev) && (size_t)lg_smem(a.r) <= device_smem_optin(dev);
}
#if !FUSEDK__PART_ALL
#pragma nv_diag_default 177
#endif
#endif // FUSEDK__PART_LINEAR || FUSEDK__PART_LOWRANK

#if FUSEDK__PART_LINEAR
// ---------------------------------------------------------------------------------------------
// lowrank_update_backward and linear_lowrank_backward (the linear part: its GEMMs run on [gemm]): where lowrank_grad_fits, the
// lowrank part's one-pass kernel (after linear_backward's dz pass; linear_lowrank's dz w added
// onto its dx by a GEMM). Else on linear's GEMM layer: h = x P and dg = dz Q as float32 GEMMs
// [M, A r] (narrow: each reads x or dz once), one pass makes dh = dg * codes and g = scaling h *
// codes in the dtype (and dcodes), then GEMMs make dx (for linear_lowrank dz w accumulated onto dh
// a in the same output), dP^T = dh^T x and dQ^T = g^T dz as float32 [A r, *]. Either way a last
// pass writes the factors' gradients through the outputs' strides.

// Per (m, j), adapter q: h = hf[m, q r + j], dg = gf[m, q rp + j] (lowrank: scaling gf[m, j]);
// a row whose id is not q has dh = g = 0 there.
template <typename T>
__global__ void lowrank_grad_mid_kernel(const fusedk__lowrank_grad_args a, const float *hf, int64_t ldh,
                                        const float *gf, int64_t ldg, T *dh, T *g, int64_t ldo) {
  const int64_t r = a.r, rp = (r + 7) / 8 * 8;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < a.M * r; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t m = i / r, j = i % r;
    const float c = a.codes.p ? to_f32(static_cast<const T *>(a.codes.p)[m * a.codes.ld + j]) : 1.f;
    float dc = 0.f;
    for (int q = 0; q < a.slots; ++q) {
      const bool on = !a.ids || a.ids[m] == q;
      const float h = on && hf ? hf[m * ldh + q * r + j] : 0.f;
      const float d = on && gf ? (a.lora ? gf[m * ldg + q * rp + j] : a.scaling * gf[m * ldg + j]) : 0.f;
      dc += d * h;
      dh[m * ldo + q * r + j] = from_f32<T>(d * c);
      g[m * ldo + q * r + j] = from_f32<T>(a.scaling * h * c);
    }
    if (a.dcodes.p) static_cast<T *>(a.dcodes.p)[m * a.dcodes.ld + j] = from_f32<T>(dc);
  }
}

// A factor's gradient through its strides: out[q oq + j oj + c oc] = s[(q r + j) lds + c] (dv
// [K, r], da [A, r, K], du_t [r, N], db [A, N, r] from the float32 [A r, cols] products)
template <typename T> struct GradOut {
  T *out;
  int64_t oq, oj, oc, lds, cols; // cols 0: not asked for
  const float *s;
};

// both factors' gradients rounded once, in one launch
template <typename T>
__global__ void lowrank_grad_store_kernel(GradOut<T> o0, GradOut<T> o1, int64_t rows, int r) {
  const int64_t n0 = rows * o0.cols, n = n0 + rows * o1.cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const GradOut<T> &o = i < n0 ? o0 : o1;
    const int64_t e = i < n0 ? i : i - n0, row = e / o.cols, c = e % o.cols;
    o.out[row / r * o.oq + row % r * o.oj + c * o.oc] = from_f32<T>(o.s[row * o.lds + c]);
  }
}

// dv[k, j] / da_q[j, k] from s1 [A r, ld1]; du_t[j, n] / db_q[n, j] from s2 [A r, ld2]
template <typename T>
fusedk_status lowrank_grad_store(const fusedk__lowrank_grad_args &a, const float *s1, int64_t ld1, const float *s2,
                                 int64_t ld2, int dev, cudaStream_t s, const char *op) {
  const int64_t R = a.slots * (int64_t)a.r;
  const GradOut<T> o0{static_cast<T *>(a.dp.p), a.lora ? a.dpa : 0, a.lora ? a.dp.ld : 1, a.lora ? 1 : a.dp.ld,
                      ld1, a.dp.p ? a.K : 0, s1},
                   o1{static_cast<T *>(a.dq.p), a.lora ? a.dqa : 0, a.lora ? 1 : a.dq.ld, a.lora ? a.dq.ld : 1,
                      ld2, a.dq.p ? a.N : 0, s2};
  const int64_t n = R * (o0.cols + o1.cols);
  if (n == 0) return FUSEDK_OK;
  const int64_t grid = std::min<int64_t>((n + 255) / 256, (int64_t)device_sms(dev) * 8);
  lowrank_grad_store_kernel<T><<<(unsigned)grid, 256, 0, s>>>(o0, o1, R, a.r);
  return on_error(cudaGetLastError(), op);
}

// g's product into g.d; with k = 0 zeros there (or nothing, accumulating); nothing for no output
fusedk_status grad_gemm(LtState &st, const LtGemm &g, int dev, cudaStream_t s, void *ws, const char *op,
                        const char *which, size_t es) {
  if (g.m == 0 || g.n == 0 || (g.k == 0 && g.acc)) return FUSEDK_OK;
  if (g.k == 0) {
    const cudaError_t e = cudaMemset2DAsync(g.d, (size_t)g.ldd * es, 0, (size_t)g.m * es, (size_t)g.n, s);
    return e == cudaSuccess ? FUSEDK_OK : cuda_fail(e, op, "memset");
  }
  bool ran;
  const fusedk_status f = lt_matmul(st, g, dev, s, ws, op, &ran);
  if (f || ran) return f;
  return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: cuBLASLt has no algorithm for the %s GEMM (m=%lld n=%lld k=%lld, "
                      "leading dims %lld, %lld) with these pointer alignments; pass compact, 16-byte aligned tensors",
                      op, which, (long long)g.m, (long long)g.n, (long long)g.k, (long long)g.lda, (long long)g.ldb);
}

template <typename T>
fusedk_status lowrank_grad(LtState &st, const fusedk__lowrank_grad_args &a, int dev, cudaStream_t s, const char *op) {
  const int64_t M = a.M, K = a.K, N = a.N, r = a.r, R = a.slots * r, rp = (r + 7) / 8 * 8;
  const int64_t Gc = a.lora ? a.slots * rp : r;           // dg's columns: w_cat's h columns, or r
  const bool lowr = a.dx.p || a.dp.p || a.dq.p || a.dcodes.p; // anything but dbias
  const bool need_h = a.dq.p || a.dcodes.p, need_g = a.dx.p || a.dp.p || a.dcodes.p;
  // one [A r, K] matrix for all of a's adapters, or one GEMM an adapter
  const bool one = !a.lora || a.slots == 1 || a.pa == r * a.p.ld;
  const int groups = one ? 1 : a.slots;
  const int64_t Rg = one ? R : r;
  const bool dx32 = a.dx.p && !rows16<T>(a.dx.p, a.dx.ld);
  auto r4 = [](int64_t n) { return (n + 3) / 4 * 4; };
  const int64_t ldh = r4(R), ldg = r4(Gc), ldo = (R + 7) / 8 * 8, ld1 = r4(K), ld2 = r4(N);
  const DzPass dp = dz_plan<T>(M, N, a.act, lowr, a.dbias != nullptr, dev);
  fusedk__lowrank_grad_args fa = a; // what the one-pass kernel reads: dz for dy (scratch: 16-byte rows)
  if (dp.dz_bytes) fa.dy = fusedk__mat{nullptr, dp.dz_ld};
  if (lowr && lowrank_grad_fits(fa, dev)) { // the one-pass kernel (lowrank part); the factors' float32 sums in scratch
    LtArena ar;
    const size_t b1 = pad256(a.dp.p ? (size_t)(R * ld1) * 4 : 0), b2 = a.dq.p ? (size_t)(R * ld2) * 4 : 0;
    cudaError_t e = lt_arena(st, dev, s, dp.dz_bytes + dp.part_bytes + b1 + b2, &ar);
    if (e != cudaSuccess) return arena_fail(e, op);
    char *base = static_cast<char *>(ar.scratch);
    if (dp.dz_bytes) fa.dy.p = base;
    float *part = a.dbias && dp.chunks ? reinterpret_cast<float *>(base + dp.dz_bytes) : nullptr;
    float *sv = a.dp.p ? reinterpret_cast<float *>(base + dp.dz_bytes + dp.part_bytes) : nullptr;
    float *su = a.dq.p ? reinterpret_cast<float *>(base + dp.dz_bytes + dp.part_bytes + b1) : nullptr;
    if ((e = dz_run<T>(dp, fa.dy, a.dy, a.aux, a.act, a.dbias, part, M, N, s)) != cudaSuccess) return on_error(e, op);
    if (b1 + b2 && (e = cudaMemsetAsync(sv ? sv : su, 0, sv && su ? b1 + b2 : sv ? b1 : b2, s)) != cudaSuccess)
      return cuda_fail(e, op, "memset");
    fusedk_status f = fusedk__cuda_lowrank_grad_pass(&fa, sv, ld1, su, ld2, op, dev, s);
    if (!f && a.lora && a.dx.p) // dx = dh a from the pass, then dz w added by the GEMM (beta 1)
      f = grad_gemm(st, {CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, a.q.p, fa.dy.p, a.q.ld, fa.dy.ld, a.dx.p, a.dx.ld,
                         CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0, false, a.scalar, 0, true},
                    dev, s, ar.ws, op, "dx", sizeof(T));
    return f ? f : lowrank_grad_store<T>(a, sv, ld1, su, ld2, dev, s, op);
  }
  size_t off[7], total = dp.dz_bytes + dp.part_bytes; // hf, gf, dh, g, s1, s2, dx32
  const size_t bytes[7] = {need_h ? (size_t)(M * ldh) * 4 : 0, need_g ? (size_t)(M * ldg) * 4 : 0,
                           lowr ? (size_t)(M * ldo) * sizeof(T) : 0, lowr ? (size_t)(M * ldo) * sizeof(T) : 0,
                           a.dp.p ? (size_t)(R * ld1) * 4 : 0, a.dq.p ? (size_t)(R * ld2) * 4 : 0,
                           dx32 ? (size_t)(M * ld1) * 4 : 0};
  for (int i = 0; i < 7; ++i) off[i] = total, total += pad256(bytes[i]);
  LtArena ar;
  cudaError_t e = lt_arena(st, dev, s, total, &ar);
  if (e != cudaSuccess) return arena_fail(e, op);
  char *base = static_cast<char *>(ar.scratch);
  auto at = [&](int i) { return bytes[i] ? static_cast<void *>(base + off[i]) : nullptr; };
  float *hf = static_cast<float *>(at(0)), *gf = static_cast<float *>(at(1)), *s1 = static_cast<float *>(at(4));
  float *s2 = static_cast<float *>(at(5)), *x32 = static_cast<float *>(at(6));
  T *dh = static_cast<T *>(at(2)), *g = static_cast<T *>(at(3));
  const fusedk__mat dz = dp.dz_bytes ? fusedk__mat{ar.scratch, dp.dz_ld} : a.dy;
  float *part = a.dbias && dp.chunks ? reinterpret_cast<float *>(base + dp.dz_bytes) : nullptr;
  if ((e = dz_run<T>(dp, dz, a.dy, a.aux, a.act, a.dbias, part, M, N, s)) != cudaSuccess) return on_error(e, op);
  for (int i = 0; i < 2 && M == 0; ++i) // no rows: the factors' gradients are sums of nothing (zeros stored below)
    if (bytes[4 + i] && (e = cudaMemsetAsync(at(4 + i), 0, bytes[4 + i], s)) != cudaSuccess) return cuda_fail(e, op, "memset");
  const size_t es = sizeof(T);
  const char *pp = static_cast<const char *>(a.p.p);
  auto pg = [&](int q) { return static_cast<const void *>(pp + (size_t)(q * a.pa) * es); }; // adapter q's P
  const cublasOperation_t tp = a.lora ? CUBLAS_OP_T : CUBLAS_OP_N, tpt = a.lora ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasLtEpilogue_t dflt = CUBLASLT_EPILOGUE_DEFAULT;
  fusedk_status f = FUSEDK_OK;
  if (lowr && M > 0) {
    // h^T [R, M] = P^T x^T: v [K, r] is column-major v^T; a_q [r, K] is column-major a_q^T (so op T)
    for (int q = 0; need_h && q < groups && !f; ++q)
      f = grad_gemm(st, {tp, CUBLAS_OP_N, Rg, M, K, pg(q), a.x.p, a.p.ld, a.x.ld, hf + q * r, ldh, dflt, nullptr,
                         nullptr, 0, true, a.scalar, 0, false}, dev, s, ar.ws, op, "h", 4);
    // dg^T [Gc, M] = Q^T dz^T: u_t [r, N] (op T); w_cat's h columns, column-major [Gc, N] (op N)
    const void *qp = a.lora ? static_cast<const char *>(a.q.p) + (size_t)K * es : a.q.p;
    if (!f && need_g)
      f = grad_gemm(st, {a.lora ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, Gc, M, N, qp, dz.p, a.q.ld, dz.ld, gf, ldg,
                         dflt, nullptr, nullptr, 0, true, a.scalar, 0, false}, dev, s, ar.ws, op, "dg", 4);
    if (f) return f;
    const int64_t grid = std::min<int64_t>((M * r + 255) / 256, (int64_t)device_sms(dev) * 8);
    lowrank_grad_mid_kernel<T><<<(unsigned)grid, 256, 0, s>>>(a, hf, ldh, gf, ldg, dh, g, ldo);
    if ((e = cudaGetLastError()) != cudaSuccess) return on_error(e, op);
  }
  if (a.dx.p && K > 0) { // dx^T [K, M] = P dh^T (+ w^T dz^T): into dx, or float32 then converted
    void *d = dx32 ? static_cast<void *>(x32) : a.dx.p;
    const int64_t ldd = dx32 ? ld1 : a.dx.ld;
    for (int q = 0; q < groups && !f && M > 0; ++q)
      f = grad_gemm(st, {tpt, CUBLAS_OP_N, K, M, Rg, pg(q), dh + q * r, a.p.ld, ldo, d, ldd, dflt, nullptr, nullptr, 0,
                         dx32, a.scalar, 0, q > 0}, dev, s, ar.ws, op, "dx", dx32 ? 4 : es);
    if (!f && a.lora)
      f = grad_gemm(st, {CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, a.q.p, dz.p, a.q.ld, dz.ld, d, ldd, dflt, nullptr, nullptr,
                         0, dx32, a.scalar, 0, true}, dev, s, ar.ws, op, "dx", dx32 ? 4 : es);
    if (f) return f;
    if (dx32 && M > 0 && (e = launch_bias_act<T>(a.dx, fusedk__mat{nullptr, 0}, fusedk__mat{x32, ld1}, true, nullptr,
                                                 FUSEDK_ACT_NONE, M, K, s, dev)) != cudaSuccess)
      return on_error(e, op);
  }
  // dP^T: s1 [R, K] = dh^T x (column-major s1^T [K, R] = x^T dh); dQ^T: s2 [R, N] = g^T dz
  if (a.dp.p && M > 0 && (f = grad_gemm(st, {CUBLAS_OP_N, CUBLAS_OP_T, K, R, M, a.x.p, dh, a.x.ld, ldo, s1, ld1, dflt,
                                             nullptr, nullptr, 0, true, a.scalar, 0, false}, dev, s, ar.ws, op, "dP", 4)))
    return f;
  if (a.dq.p && M > 0 && (f = grad_gemm(st, {CUBLAS_OP_N, CUBLAS_OP_T, N, R, M, dz.p, g, dz.ld, ldo, s2, ld2, dflt,
                                             nullptr, nullptr, 0, true, a.scalar, 0, false}, dev, s, ar.ws, op, "dQ", 4)))
    return f;
  return lowrank_grad_store<T>(a, s1, ld1, s2, ld2, dev, s, op);
}
#endif // FUSEDK__PART_LINEAR

#if FUSEDK__PART_LOWRANK
// ---------------------------------------------------------------------------------------------
// lowrank_update: out = beta y + scaling ((x v) * codes) u_t
//
// lowrank_mma_kernel (f16/bf16, rows 16-byte aligned): a block of 4 WS warps owns 64 rows, WS
// warps a 16-row group (phase 1: k steps by turns, the partial h summed through shared memory;
// phase 2: a share of each column tile; WS = 2 doubles the warps an SM has to hide latency), and
// one of `splits` column ranges of out (split only where the row blocks alone would
// leave SMs idle: each split recomputes x v, its x rows from L2 after the first). Phase 1 streams
// x's rows and v's through a ring of shared-memory stages in W-wide k tiles (64; 128 for
// lowrank_update at rank 16: fewer barriers and loads a byte; cp.async, a tile
// landing while the stages before it are computed; one barrier a tile) into h = x v, the warp's
// [16, RT] accumulators (RT: the rank rounded up to 16; v's columns past r load as zeros).
// codes and scaling multiply h there, and h, rounded once to T, is phase 2's a operand (pack_a):
// the [M, r] product never leaves the chip. Phase 2 streams u_t's W-column tiles and y's through
// a second ring over the same memory, adds beta y to h u_t, writes the sums into y's place in the
// stage and stores them in 16-byte chunks (whole 32-byte sectors: the accumulators' 4-byte pairs
// half-fill theirs, twice L2's write traffic). y is read once, out written once, x once a split;
// v and u_t come from L2 to every block. Where the row blocks fill at most 3/4 of the SMs (Flux's
// 4608 rows), the phases are two launches (kLrH, kLrOut): phase 1 split by k writes float32
// partial h ([splits, M, r rounded up to 8]: L2-sized), and phase 2's blocks, split finely by
// out's columns, sum them in split order instead of recomputing x v; out's stream then fills
// every SM.
// lowrank_fma_kernel (float32, and 16-bit views the 16-byte loads can't take): the same two
// phases on CUDA cores, h in shared memory as float32.
// ---------------------------------------------------------------------------------------------


// shared memory of the tensor-core kernel: phase 1's stages (x's and v's k tiles), then phase
// 2's over the same bytes (u_t's and y's column tiles)
template <int RT, int W = kLrK, int ST = kLrStages<RT>> struct LrSmem {
  static constexpr int kX = kLrRows * W * 2, kStage1 = kX + W * RT * 2, kU = RT * W * 2,
                       kStage2 = kU + kLrRows * W * 2, kBytes = ST * std::max(kStage1, kStage2);
};

// two 16-bit values (one 32-bit word) as floats
template <typename T> __device__ __forceinline__ void unpack2(uint32_t w, float (&f)[2]) {
  Raw<T, 2> r;
  r.w[0] = w;
  to_floats<T, 2>(r, f);
}

// acc[the warp's 16 rows, RT] += A B over a stage's W-wide k tile: A the [64 rows, W k] tile at
// as (kA), B at bs either [W k, RT] (KN: v's tiles, kBt) or [RT, W k] (a's or u_t's rows, kB);
// share s takes the k steps s, s + WS, ...
template <typename T, int RT, int WS, bool KN, int W = kLrK>
__device__ __forceinline__ void lr_row_mma(float (&acc)[RT / 8][4], uint32_t as, uint32_t bs, int warp, int s, int lane) {
  const auto A = WarpOperand<W / 8, kA>(as, lane).from(warp, s);
  auto c = [&](int, int t) -> float(&)[4] { return acc[t]; };
  if constexpr (KN) warp_mma<T, 1, RT / 16, W / 16 / WS, WS>(c, A, WarpOperand<RT / 8, kBt>(bs, lane).k_from(s));
  else warp_mma<T, 1, RT / 16, W / 16 / WS, WS>(c, A, WarpOperand<W / 8, kB>(bs, lane).k_from(s));
}

// d[the warp's 16 rows, share s's W / WS columns of a W-column tile] = ha B: ha the warp's
// [16, RT] as a operands, B at bs either [RT, W n] (KN: u_t's tiles, kBt) or [W n, RT] (v's
// tiles, for dh v^T: kB)
template <typename T, int RT, int WS, bool KN, int W = kLrN>
__device__ __forceinline__ void lr_out_mma(float (&d)[W / 8 / WS][4], const uint32_t (&ha)[RT / 16][4], uint32_t bs,
                                           int s, int lane) {
  constexpr int NP = W / 16 / WS; // the share's pairs of n8 tiles: s NP .. + NP
#pragma unroll
  for (int t = 0; t < 2 * NP; ++t) d[t][0] = d[t][1] = d[t][2] = d[t][3] = 0.f;
  auto c = [&](int, int t) -> float(&)[4] { return d[t]; };
  if constexpr (KN) warp_mma<T, 1, NP, RT / 16>(c, in_regs(ha), WarpOperand<W / 8, kBt>(bs, lane).i_from(s * NP));
  else warp_mma<T, 1, NP, RT / 16>(c, in_regs(ha), WarpOperand<RT / 8, kB>(bs, lane).i_from(s * NP));
}

// out's tile [64 rows, 64 columns] at (m0, n0), the warp's part (its rows, share s's columns):
// d (+ beta y, y's tile at ys when Y) rounded into ys (y's place, or a [64, 64] room), then back
// out by 16-byte chunks: whole 32-byte sectors (the accumulators' 4-byte pairs half-fill theirs,
// twice L2's write traffic), a row's run of the share's columns
template <typename T, int WS, bool Y, int W = kLrN>
__device__ __forceinline__ void lr_store_tile(const float (&d)[W / 8 / WS][4], uint32_t ys, float beta, T *out,
                                              int64_t ld, int64_t m0, int64_t n0, int rows, int64_t cols, int warp,
                                              int s, int lane) {
  constexpr int CW = W / 8 / WS; // the share's chunks a row
  const int c0 = 2 * (lane % 4);
  __syncwarp(); // the room's previous chunks read
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int t = 0; t < CW; ++t) {
      const uint32_t at = ys + swz<W / 8>(16 * warp + lane / 4 + 8 * hf, s * CW + t) + c0 * 2;
      float o[2] = {d[t][2 * hf], d[t][2 * hf + 1]};
      if constexpr (Y) {
        uint32_t w;
        asm volatile("ld.shared.b32 %0, [%1];" : "=r"(w) : "r"(at));
        float yf[2];
        unpack2<T>(w, yf);
        o[0] = fmaf(beta, yf[0], o[0]), o[1] = fmaf(beta, yf[1], o[1]);
      }
      asm volatile("st.shared.b32 [%0], %1;" ::"r"(at), "r"(pack2<T>(o[0], o[1])) : "memory");
    }
  __syncwarp();
#pragma unroll
  for (int q = lane; q < 16 * CW; q += 32) {
    // a store's lanes: 32 / CW rows' runs of CW chunks; CW 4: a quarter warp rows i and i + 4,
    // whose runs the swizzle keeps apart (rows i, i + 1 would share banks)
    const int lr = 16 * warp + (CW == 4 ? 8 * (q / 32) + (q % 32) / 8 + 4 * (q % 8 / 4) : q / CW),
              ch = s * CW + q % CW;
    if (lr >= rows || n0 + 8 * ch >= cols) continue;
    uint32_t w[4];
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                 : "r"(ys + swz<W / 8>(lr, ch)));
    st_cs(out + (m0 + lr) * ld + n0 + 8 * ch, w[0], w[1], w[2], w[3]);
  }
}

// The WS shares' partial sums of each row group, through the shared memory at smem (free bytes: a
// drained ring's, or a room of their own); every share ends with the whole sum, and the barriers
// leave the bytes free again
template <int RT, int WS> __device__ __forceinline__ void lr_share_sum(float (&h)[RT / 8][4], unsigned char *smem) {
  if constexpr (WS > 1) {
    constexpr int NT = 128 * WS;
    float4 *part = reinterpret_cast<float4 *>(smem) + (size_t)threadIdx.x * (RT / 8);
#pragma unroll
    for (int t = 0; t < RT / 8; ++t) part[t] = make_float4(h[t][0], h[t][1], h[t][2], h[t][3]);
    __syncthreads();
#pragma unroll
    for (int o = 1; o < WS; ++o) {
      const float4 *q = reinterpret_cast<const float4 *>(smem) + (size_t)((threadIdx.x + 128 * o) % NT) * (RT / 8);
#pragma unroll
      for (int t = 0; t < RT / 8; ++t) {
        const float4 f = q[t];
        h[t][0] += f.x, h[t][1] += f.y, h[t][2] += f.z, h[t][3] += f.w;
      }
    }
    __syncthreads();
  }
}

// A block's place in lowrank_mma_kernel: its 64 rows from m0 (rows of them in the tensor), the
// lane's rows r0 and r0 + 8 and columns c0, c0 + 1 of each n8 tile; warp: the 16-row group,
// s: the warp's share of it; hw: h's columns (rp, the rank rounded up to 8, an adapter slot)
struct LrBlock {
  int lane, warp, s, c0, rows, rp, hw;
  int64_t m0, r0;
};

// kLrOut's h: the k splits' float32 sums, added in split order (the same bits run to run); a
// split's loads all in flight at once
template <int RT> __device__ __forceinline__ void lr_sum_parts(float (&h)[RT / 8][4], const fusedk__lowrank_args &a,
                                                               const LrBlock &q) {
  for (int sp = 0; sp < a.part_splits; ++sp) {
    float2 f[RT / 8][2];
#pragma unroll
    for (int t = 0; t < RT / 8; ++t)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int64_t row = q.r0 + 8 * hf;
        const int j = 8 * t + q.c0; // j, j + 1 < hw together (hw a multiple of 8)
        f[t][hf] = row < a.M && j < q.hw ? *reinterpret_cast<const float2 *>(a.part + (sp * a.M + row) * q.hw + j)
                                         : make_float2(0.f, 0.f);
      }
#pragma unroll
    for (int t = 0; t < RT / 8; ++t)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) h[t][2 * hf] += f[t][hf].x, h[t][2 * hf + 1] += f[t][hf].y;
  }
}

// Phase 1: h += x v (CAT: x a^T, a's rows the adapters' r rows a slot of rp) over k tiles
// [kt0, kt0 + n) of both through the ring; CAT also copies x's tiles on to out's first K1 columns
// (16-byte chunks, K1 % 8 == 0), unless out is x's own rows with room for h. The WS shares' sums
// are added at the end: every share has the row group's h.
template <typename T, int RT, bool VV, int WS, bool CAT, int W, int ST>
__device__ __forceinline__ void lr_h_mainloop(float (&h)[RT / 8][4], const fusedk__lowrank_args &a, const LrBlock &q,
                                              unsigned char *smem, int kt0, int n) {
  using L = LrSmem<RT, W, ST>;
  constexpr int NT = 128 * WS;
  const uint32_t base = smem_u32(smem);
  const T *x = (const T *)a.x.p + q.m0 * a.x.ld, *v = (const T *)a.v.p;
  ring_run<ST>(
      n,
      [&](int kl, int st) {
        const uint32_t xs = base + st * L::kStage1;
        const int64_t k0 = (int64_t)(kt0 + kl) * W;
        const int kv = (int)min((int64_t)W, a.K1 - k0);
        load_tile<T, kLrRows, W / 8, NT, true>(xs, x + k0, a.x.ld, q.rows, kv);
        if constexpr (CAT) { // a's [RT, k] tile: h column j is adapter j / rp's row j % rp (zeros past r)
          for (int i = threadIdx.x; i < RT * (W / 8); i += NT) {
            const int j = i / (W / 8), c = i % (W / 8), ad = j / q.rp;
            const bool in = ad < a.slots && j % q.rp < a.r && c * 8 < kv;
            cp_async16(xs + L::kX + swz<W / 8>(j, c), in ? v + ad * a.va + (j % q.rp) * a.v.ld + k0 + c * 8 : v,
                       in ? 16 : 0);
          }
        } else load_tile<T, W, RT / 8, NT, VV>(xs + L::kX, v + k0 * a.v.ld, a.v.ld, kv, a.r);
      },
      [&](int kl, int st) {
        const uint32_t xs = base + st * L::kStage1;
        if (CAT && a.out.p != a.x.p) {
          const int64_t k0 = (int64_t)(kt0 + kl) * W;
          for (int i = threadIdx.x; i < kLrRows * W / 8; i += NT) {
            const int lr = i / (W / 8), ch = i % (W / 8);
            if (lr >= q.rows || k0 + 8 * ch >= a.K1) continue;
            uint32_t w[4];
            asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                         : "r"(xs + swz<W / 8>(lr, ch)));
            *reinterpret_cast<uint4 *>((T *)a.out.p + (q.m0 + lr) * a.out.ld + k0 + 8 * ch) =
                make_uint4(w[0], w[1], w[2], w[3]);
          }
        }
        lr_row_mma<T, RT, WS, !CAT, W>(h, xs, xs + L::kX, q.warp, q.s, q.lane);
      });
  lr_share_sum<RT, WS>(h, smem);
}

// A k split's float32 sums of h into part[split] (codes and ids follow once they are summed:
// lowrank_cat_finish_kernel, kLrOut); one share stores
template <int RT> __device__ __forceinline__ void lr_store_part(const float (&h)[RT / 8][4], const fusedk__lowrank_args &a,
                                                                const LrBlock &q, int split) {
#pragma unroll
  for (int t = 0; t < RT / 8; ++t)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int64_t row = q.r0 + 8 * hf;
      const int j = 8 * t + q.c0;
      if (q.s == 0 && row < a.M && j < q.hw)
        *reinterpret_cast<float2 *>(a.part + (split * a.M + row) * q.hw + j) = make_float2(h[t][2 * hf], h[t][2 * hf + 1]);
    }
}

// [x | h]'s h: h (times codes) where the row's id selects the adapter, else 0 (selected, not
// multiplied: an inf in x would make NaN), rounded into out's columns K1 .. K1 + A rp; one share
// stores
template <typename T, int RT> __device__ __forceinline__ void lr_store_cat(const float (&h)[RT / 8][4],
                                                                          const fusedk__lowrank_args &a, const LrBlock &q) {
  const T *codes = (const T *)a.codes.p;
#pragma unroll
  for (int t = 0; t < RT / 8; ++t)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int64_t row = q.r0 + 8 * hf;
      const int j = 8 * t + q.c0, ad = j / q.rp, jj = j % q.rp; // j even, rp a multiple of 8: j + 1 in the same slot
      if (q.s != 0 || row >= a.M || ad >= a.slots) continue;
      const bool on = !a.ids || a.ids[row] == ad;
      float o[2];
#pragma unroll
      for (int e = 0; e < 2; ++e)
        o[e] = on && jj + e < a.r ? h[t][2 * hf + e] * (codes ? (float)codes[row * a.codes.ld + jj + e] : 1.f) : 0.f;
      *reinterpret_cast<uint32_t *>((T *)a.out.p + row * a.out.ld + a.K1 + j) = pack2<T>(o[0], o[1]);
    }
}

// Phase 2: out = beta y + h u_t over column tiles [nb, ne) (ha: h with codes and scaling, as a
// operands), the sums written into y's place in the stage (a stage without y has the room)
template <typename T, int RT, int WS, int W, int ST>
__device__ __forceinline__ void lr_out_mainloop(const uint32_t (&ha)[RT / 16][4], const fusedk__lowrank_args &a,
                                                const LrBlock &q, uint32_t base, int nb, int ne) {
  using L = LrSmem<RT, W, ST>;
  constexpr int NT = 128 * WS;
  const T *y = (const T *)a.y.p, *u = (const T *)a.u_t.p;
  ring_run<ST>(
      ne - nb,
      [&](int i, int st) {
        const uint32_t us = base + st * L::kStage2;
        const int64_t n0 = (int64_t)(nb + i) * W;
        const int nv = (int)min((int64_t)W, a.K2 - n0);
        load_tile<T, RT, W / 8, NT, true>(us, u + n0, a.u_t.ld, a.r, nv);
        if (y) load_tile<T, kLrRows, W / 8, NT, true>(us + L::kU, y + q.m0 * a.y.ld + n0, a.y.ld, q.rows, nv);
      },
      [&](int i, int st) {
        const uint32_t us = base + st * L::kStage2;
        float d[W / 8 / WS][4];
        lr_out_mma<T, RT, WS, true, W>(d, ha, us, q.s, q.lane);
        const int64_t n0 = (int64_t)(nb + i) * W;
        if (y)
          lr_store_tile<T, WS, true, W>(d, us + L::kU, a.beta, (T *)a.out.p, a.out.ld, q.m0, n0, q.rows, a.K2, q.warp,
                                        q.s, q.lane);
        else
          lr_store_tile<T, WS, false, W>(d, us + L::kU, 0.f, (T *)a.out.p, a.out.ld, q.m0, n0, q.rows, a.K2, q.warp,
                                         q.s, q.lane);
      });
}

// lowrank_mma_kernel's passes: lowrank_update in one (kLrUpdate); linear_lowrank's [x | h]
// (kLrCat; kLrCatSplit: split by k into float32 partial sums); lowrank_update in two where its row
// blocks fill at most 3/4 of the SMs: h's k splits' float32 sums (kLrH), then out from them
// (kLrOut, split by columns: every block streams out without recomputing x v)
enum LrPass { kLrUpdate, kLrCat, kLrCatSplit, kLrH, kLrOut };

// P: the pass; W: the tiles' width, ST: the rings' stages. Block b: row block b / splits, split
// b % splits of the pass's k tiles (part) or of out's column tiles (per a split)
template <typename T, int RT, bool VV, int WS, int P, int W = kLrK, int ST = kLrStages<RT>>
__global__ void __launch_bounds__(128 * WS, RT <= 32 ? 4 / WS : 2 / WS) lowrank_mma_kernel(const fusedk__lowrank_args a,
                                                                                          int splits, int per) {
  constexpr bool cat = P == kLrCat || P == kLrCatSplit, part = P == kLrCatSplit || P == kLrH;
  extern __shared__ __align__(128) unsigned char lr_smem[];
  LrBlock q;
  q.lane = threadIdx.x % 32, q.warp = threadIdx.x / 32 % 4, q.s = threadIdx.x / 128, q.c0 = 2 * (q.lane % 4);
  q.m0 = (int64_t)(blockIdx.x / splits) * kLrRows, q.r0 = q.m0 + 16 * q.warp + q.lane / 4;
  q.rows = (int)min((int64_t)kLrRows, a.M - q.m0), q.rp = (a.r + 7) / 8 * 8, q.hw = (cat ? a.slots : 1) * q.rp;
  const int split = (int)(blockIdx.x % splits);

  float h[RT / 8][4];
#pragma unroll
  for (int t = 0; t < RT / 8; ++t) h[t][0] = h[t][1] = h[t][2] = h[t][3] = 0.f;
  if constexpr (P == kLrOut) lr_sum_parts<RT>(h, a, q);
  else {
    const int nk = (int)((a.K1 + W - 1) / W), kt0 = part ? split * per : 0;
    lr_h_mainloop<T, RT, VV, WS, cat, W, ST>(h, a, q, lr_smem, kt0, part ? max(0, min(per, nk - kt0)) : nk);
  }
  if constexpr (part) return lr_store_part<RT>(h, a, q, split);
  if constexpr (cat) return lr_store_cat<T, RT>(h, a, q);
  // codes and scaling on h, then h rounded to T as phase 2's a operand
  const T *codes = (const T *)a.codes.p;
#pragma unroll
  for (int t = 0; t < RT / 8; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t row = q.r0 + 8 * (e / 2);
      const int j = 8 * t + q.c0 + e % 2;
      h[t][e] *= codes ? (row < a.M && j < a.r ? a.scaling * (float)codes[row * a.codes.ld + j] : 0.f) : a.scaling;
    }
  uint32_t ha[RT / 16][4];
  pack_a<T, RT>(ha, h);
  const int nb = split * per;
  lr_out_mainloop<T, RT, WS, W, ST>(ha, a, q, smem_u32(lr_smem), nb, min((int)((a.K2 + W - 1) / W), nb + per));
}

// ---------------------------------------------------------------------------------------------
// lowrank_grad_kernel: lowrank_update's backward in one row-block pass (f16/bf16, 16-byte rows,
// K and N multiples of 8), a block of 64 rows as lowrank_mma_kernel's, three rings:
//   A. x's and v's k tiles: h = x v (only for du_t or dcodes); g = scaling h codes, rounded,
//      into z (shared memory, [64, RT]);
//   B. dy's and u_t's column tiles: dg = scaling dy u_t^T per row group, and g^T dy, the tile's
//      [r, 64] of du_t, added into the float32 sum su; then dcodes = dg h, dh = dg codes into z
//      and into registers as the a operand;
//   C. x's and v's k tiles again: dx = dh v^T (staged in shared memory, 16-byte stores) and
//      dh^T x, the tile's [r, 64] of dv^T, added into sv.
// dy is read once, x twice (its second read from L2 where the rows in flight fit), dx written
// once; the factors' [r, K] and [r, N] sums are float32 reductions in L2 (red.global.add, the
// order of a row block's terms not fixed; each block starts its rings at its own tile so the
// blocks' adds spread over the columns). The caller zeroes su and sv and rounds them into dv,
// du_t afterwards.
// ---------------------------------------------------------------------------------------------

// p[0..3] += v in L2 (one 16-byte reduction on sm_90)
__device__ __forceinline__ void red_add4(float *p, float4 v) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
#else
  atomicAdd(p, v.x), atomicAdd(p + 1, v.y), atomicAdd(p + 2, v.z), atomicAdd(p + 3, v.w);
#endif
}

// sum[j, c0 + c] += (Z^T T)[j, c] over the block's 64 rows, j < r, c0 + c < cols: Z the block's
// [64, RT] at zs, T a stage's [64 rows, W columns] tile at ts; 16x16 units by the warps in turn
template <typename T, int RT, int NT, int W>
__device__ __forceinline__ void lg_rows_sum(uint32_t zs, uint32_t ts, float *sum, int64_t ld, int r, int64_t c0,
                                            int64_t cols, int lane) {
  const WarpOperand<RT / 8, kAt> Z(zs, lane); // Z^T's a fragments: Z's rows are the product's k
  const WarpOperand<W / 8, kBt> Tt(ts, lane);
  for (int u = (int)threadIdx.x / 32; u < RT / 16 * (W / 16); u += NT / 32) {
    const int m = u / (W / 16), n = u % (W / 16);
    float d[2][4] = {};
    warp_mma<T, 1, 1, kLrRows / 16>([&](int, int t) -> float(&)[4] { return d[t]; }, Z.i_from(m), Tt.i_from(n));
    // lanes 2i, 2i + 1 (columns c, c + 2 of rows j, j + 8) trade pairs: the even lane adds row
    // j's four columns from c, the odd one row j + 8's (c a multiple of 4, cols of 8: all in)
    const bool odd = lane & 1;
    const int j = 16 * m + lane / 4 + (odd ? 8 : 0);
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const float p0 = __shfl_xor_sync(~0u, odd ? d[t][0] : d[t][2], 1), p1 = __shfl_xor_sync(~0u, odd ? d[t][1] : d[t][3], 1);
      const int64_t c = c0 + 16 * n + 8 * t + 2 * (lane % 4) - (odd ? 2 : 0);
      if (j < r && c < cols)
        red_add4(sum + j * ld + c, odd ? make_float4(p0, p1, d[t][2], d[t][3]) : make_float4(d[t][0], d[t][1], p0, p1));
    }
  }
}

// z[row, j] = f(e, row, j) rounded to T (one share writes; every share has the row group's sums)
template <typename T, int RT, typename F>
__device__ __forceinline__ void lg_to_z(uint32_t zs, const float (&c)[RT / 8][4], int warp, int s, int lane, F &&f) {
  if (s != 0) return;
#pragma unroll
  for (int t = 0; t < RT / 8; ++t)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = 16 * warp + lane / 4 + 8 * hf, j = 8 * t + 2 * (lane % 4);
      asm volatile("st.shared.b32 [%0], %1;" ::"r"(zs + swz<RT / 8>(row, j / 8) + (j % 8) * 2),
                   "r"(pack2<T>(f(c[t][2 * hf], row, j), f(c[t][2 * hf + 1], row, j + 1)))
                   : "memory");
    }
}

template <typename T, int RT, bool VV, int WS, int W, int ST, bool LORA>
__global__ void __launch_bounds__(128 * WS, RT <= 32 ? 4 / WS : 2 / WS)
    lowrank_grad_kernel(const fusedk__lowrank_grad_args a, float *sv, int64_t ldv, float *su, int64_t ldu) {
  using L = LgSmem<RT, WS, W, ST>;
  constexpr int NT = 128 * WS;
  extern __shared__ __align__(128) unsigned char lr_smem[];
  const uint32_t base = smem_u32(lr_smem), zs = base + L::kZ, os = base + L::kO;
  unsigned char *sums = lr_smem + L::kSum;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4, s = threadIdx.x / 128;
  const int64_t m0 = (int64_t)blockIdx.x * kLrRows;
  const int rows = (int)min((int64_t)kLrRows, a.M - m0);
  const T *x = (const T *)a.x.p + m0 * a.x.ld, *dy = (const T *)a.dy.p + m0 * a.dy.ld, *v = (const T *)a.p.p,
          *u = (const T *)a.q.p, *codes = (const T *)a.codes.p;
  const int nk = (int)((a.K + W - 1) / W), nn = (int)((a.N + W - 1) / W);
  // (row, j) counts where the block has the row, its id takes the adapter and P the column: else
  // g, dh and dcodes are 0 there, selected (not multiplied: an inf in x would make NaN)
  auto on = [&](int row, int j) { return row < rows && j < a.r && (!a.ids || a.ids[m0 + row] == 0); };
  auto code = [&](int row, int j) { return codes ? (float)codes[(m0 + row) * a.codes.ld + j] : 1.f; };
  auto k_at = [&](int i) { return (int64_t)((i + blockIdx.x) % nk) * W; }; // the block's i-th k tile
  auto load_xv = [&](int i, int st, bool with_x) { // x's (with_x) and P's: v's [W, RT] or a's [RT, W]
    const uint32_t xs = base + st * L::kStage;
    const int64_t k0 = k_at(i);
    const int kv = (int)min((int64_t)W, a.K - k0);
    if (with_x) load_tile<T, kLrRows, W / 8, NT, true>(xs, x + k0, a.x.ld, rows, kv);
    if constexpr (LORA) load_tile<T, RT, W / 8, NT, true>(xs + L::kX, v + k0, a.p.ld, a.r, kv);
    else load_tile<T, W, RT / 8, NT, VV>(xs + L::kX, v + k0 * a.p.ld, a.p.ld, kv, a.r);
  };

  // A: h = x P (P: v, or a^T); g = scaling h codes into z
  float h[RT / 8][4];
#pragma unroll
  for (int t = 0; t < RT / 8; ++t) h[t][0] = h[t][1] = h[t][2] = h[t][3] = 0.f;
  if (su || a.dcodes.p) {
    ring_run<ST>(nk, [&](int i, int st) { load_xv(i, st, true); }, [&](int, int st) {
      const uint32_t xs = base + st * L::kStage;
      lr_row_mma<T, RT, WS, !LORA, W>(h, xs, xs + L::kX, warp, s, lane);
    });
    lr_share_sum<RT, WS>(h, sums);
    lg_to_z<T, RT>(zs, h, warp, s, lane, [&](float e, int row, int j) { return on(row, j) ? a.scaling * e * code(row, j) : 0.f; });
  }
  __syncthreads(); // z written

  // B: dg = dy Q over dy's column tiles (Q: u_t^T, or w_cat's adapter columns [N, r]), g^T dy into su
  float dg[RT / 8][4];
#pragma unroll
  for (int t = 0; t < RT / 8; ++t) dg[t][0] = dg[t][1] = dg[t][2] = dg[t][3] = 0.f;
  auto n_at = [&](int i) { return (int64_t)((i + blockIdx.x) % nn) * W; };
  ring_run<ST>(
      nn,
      [&](int i, int st) {
        const uint32_t ds = base + st * L::kStage;
        const int64_t n0 = n_at(i);
        const int nv = (int)min((int64_t)W, a.N - n0);
        load_tile<T, kLrRows, W / 8, NT, true>(ds, dy + n0, a.dy.ld, rows, nv);
        if constexpr (LORA) load_tile<T, W, RT / 8, NT, VV>(ds + L::kX, u + n0 * a.q.ld + a.K, a.q.ld, nv, a.r);
        else load_tile<T, RT, W / 8, NT, true>(ds + L::kX, u + n0, a.q.ld, a.r, nv);
      },
      [&](int i, int st) {
        const uint32_t ds = base + st * L::kStage;
        lr_row_mma<T, RT, WS, LORA, W>(dg, ds, ds + L::kX, warp, s, lane);
        if (su) lg_rows_sum<T, RT, NT, W>(zs, ds, su, ldu, a.r, n_at(i), a.N, lane);
      });
  lr_share_sum<RT, WS>(dg, sums);
  // dcodes = dg h; dh = dg codes (into h, then z); w_cat's columns hold the scaling already
  T *dcodes = (T *)a.dcodes.p;
#pragma unroll
  for (int t = 0; t < RT / 8; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * warp + lane / 4 + 8 * (e / 2), j = 8 * t + 2 * (lane % 4) + e % 2;
      const float d = (LORA ? 1.f : a.scaling) * dg[t][e];
      if (dcodes && s == 0 && row < rows && j < a.r) dcodes[(m0 + row) * a.dcodes.ld + j] = from_f32<T>(on(row, j) ? d * h[t][e] : 0.f);
      h[t][e] = on(row, j) ? d * code(row, j) : 0.f;
    }
  if (!sv && !a.dx.p) return;
  lg_to_z<T, RT>(zs, h, warp, s, lane, [](float e, int, int) { return e; });
  uint32_t ha[RT / 16][4];
  pack_a<T, RT>(ha, h);
  __syncthreads(); // z written

  // C: dx = dh P^T and dh^T x into sv, over x's and P's k tiles
  ring_run<ST>(nk, [&](int i, int st) { load_xv(i, st, sv != nullptr); }, [&](int i, int st) {
    const uint32_t xs = base + st * L::kStage;
    if (a.dx.p) {
      float d[W / 8 / WS][4];
      lr_out_mma<T, RT, WS, LORA, W>(d, ha, xs + L::kX, s, lane);
      lr_store_tile<T, WS, false, W>(d, os, 0.f, (T *)a.dx.p, a.dx.ld, m0, k_at(i), rows, a.K, warp, s, lane);
    }
    if (sv) lg_rows_sum<T, RT, NT, W>(zs, xs, sv, ldv, a.r, k_at(i), a.K, lane);
  });
}

constexpr int kLfRows = 32, kLfK = 32; // the CUDA-core kernel: rows a block (8 warps), x's k tile

// RQ: the rank's 32-column groups (a lane owns columns lane + 32 q of h)
template <typename T, int RQ> __global__ void __launch_bounds__(256) lowrank_fma_kernel(const fusedk__lowrank_args a) {
  __shared__ float xs[kLfRows][kLfK + 1], vs[kLfK][32 * RQ], hs[kLfRows][32 * RQ];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t m0 = (int64_t)blockIdx.x * kLfRows;
  const T *x = (const T *)a.x.p, *v = (const T *)a.v.p, *u = (const T *)a.u_t.p, *codes = (const T *)a.codes.p,
          *y = (const T *)a.y.p;
  const bool cat = a.mode == FUSEDK__LR_CAT; // x copied on to out (unless out is x's own rows), v
  const int rp = (a.r + 7) / 8 * 8;          // holds a [A, r, K1]: h column j is adapter j / rp's row j % rp
  float acc[kLfRows / 8][RQ] = {}; // rows warp + 8 i
  for (int64_t k0 = 0; k0 < a.K1; k0 += kLfK) {
    for (int i = threadIdx.x; i < kLfRows * kLfK; i += 256) {
      const int64_t row = m0 + i / kLfK, k = k0 + i % kLfK;
      const bool in = row < a.M && k < a.K1;
      const T e = in ? x[row * a.x.ld + k] : T(0.f);
      if (cat && in && a.out.p != a.x.p) ((T *)a.out.p)[row * a.out.ld + k] = e; // (x with room: in place)
      xs[i / kLfK][i % kLfK] = (float)e;
    }
    for (int i = threadIdx.x; i < kLfK * 32 * RQ; i += 256) {
      const int64_t k = k0 + i / (32 * RQ);
      const int j = i % (32 * RQ);
      const bool in = k < a.K1 && (cat ? j / rp < a.slots && j % rp < a.r : j < a.r);
      vs[i / (32 * RQ)][j] = in ? (float)v[cat ? j / rp * a.va + j % rp * a.v.ld + k : k * a.v.ld + j] : 0.f;
    }
    __syncthreads();
#pragma unroll 4
    for (int k = 0; k < kLfK; ++k)
#pragma unroll
      for (int i = 0; i < kLfRows / 8; ++i)
#pragma unroll
        for (int q = 0; q < RQ; ++q) acc[i][q] = fmaf(xs[warp + 8 * i][k], vs[k][lane + 32 * q], acc[i][q]);
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kLfRows / 8; ++i)
#pragma unroll
    for (int q = 0; q < RQ; ++q) {
      const int64_t row = m0 + warp + 8 * i;
      const int j = lane + 32 * q, jc = cat ? j % rp : j; // codes' column: the adapter's row of a
      hs[warp + 8 * i][j] =
          acc[i][q] * (codes ? (row < a.M && jc < a.r ? a.scaling * (float)codes[row * a.codes.ld + jc] : 0.f) : a.scaling);
    }
  __syncthreads();
  const int rows = (int)min((int64_t)kLfRows, a.M - m0);
  if (cat) { // h where the row's id selects the adapter (zeros past r, whatever x holds), rounded,
             // into out's columns K1 .. K1 + A rp
    const int W = a.slots * rp;
    for (int i = threadIdx.x; i < rows * W; i += 256) {
      const int m = i / W, j = i % W;
      const bool on = j % rp < a.r && (!a.ids || a.ids[m0 + m] == j / rp);
      ((T *)a.out.p)[(m0 + m) * a.out.ld + a.K1 + j] = T(on ? hs[m][j] : 0.f);
    }
    return;
  }
  for (int64_t n = threadIdx.x; n < a.K2; n += 256) { // a thread a column of the block's rows
    float o[kLfRows] = {};
    for (int j = 0; j < a.r; ++j) {
      const float uj = (float)u[j * a.u_t.ld + n];
#pragma unroll
      for (int m = 0; m < kLfRows; ++m) o[m] = fmaf(hs[m][j], uj, o[m]);
    }
#pragma unroll
    for (int m = 0; m < kLfRows; ++m)
      if (m < rows) {
        T *p = (T *)a.out.p + (m0 + m) * a.out.ld + n;
        *p = (T)(y ? fmaf(a.beta, (float)y[(m0 + m) * a.y.ld + n], o[m]) : o[m]);
      }
  }
}

// lowrank_prepare: out [N, K1 + rp] = [w | scaling b | 0], an element a thread (once an adapter);
// scaling b in double, rounded once (as the CPU reference: the same bits)
template <typename T> __global__ void lowrank_prepare_kernel(const fusedk__lowrank_args a) {
  const int rp = (a.r + 7) / 8 * 8;
  const int64_t W = a.K1 + a.slots * rp, n = a.M * W;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = i / W, c = i % W, q = (c - a.K1) / rp, j = (c - a.K1) % rp; // adapter q's column j
    const double b = c >= a.K1 && j < a.r ? (double)(float)((const T *)a.v.p)[q * a.va + row * a.v.ld + j] : 0.0;
    ((T *)a.out.p)[row * a.out.ld + c] = c < a.K1 ? ((const T *)a.x.p)[row * a.x.ld + c] : T((double)a.scaling * b);
  }
}

// CAT split into k ranges: h = the splits' float32 sums in split order (the same bits run to run),
// codes and ids as lowrank_mma_kernel applies them, rounded into out's columns K1 .. K1 + A rp
template <typename T> __global__ void lowrank_cat_finish_kernel(const fusedk__lowrank_args a, int splits) {
  const int rp = (a.r + 7) / 8 * 8, W = a.slots * rp;
  const T *codes = (const T *)a.codes.p;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < a.M * W; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t m = i / W;
    const int j = (int)(i % W), jj = j % rp;
    float hsum = 0.f;
    for (int sp = 0; sp < splits; ++sp) hsum += a.part[(sp * a.M + m) * W + j];
    const bool on = jj < a.r && (!a.ids || a.ids[m] == j / rp);
    ((T *)a.out.p)[m * a.out.ld + a.K1 + j] = T(on ? hsum * (codes ? (float)codes[m * a.codes.ld + jj] : 1.f) : 0.f);
  }
}

// the tensor-core kernel takes the call: 16-bit, and every row of x, u_t, y and out 16-byte
// aligned (lr_vec; v's rows too, or loaded element by element: ranks not a multiple of 8)

// the two-pass lowrank_update's float32 partial h, a (device, stream), and the lock that keeps a
// call's two launches together
StreamBuffers &lr_buffers() {
  static StreamBuffers *b = new StreamBuffers; // never destroyed: no teardown order at exit
  return *b;
}
std::mutex &lr_buffers_order() {
  static std::mutex *m = new std::mutex;
  return *m;
}

// Each pass's blocks: its row blocks times splits of its tiles (about `ask`, none left empty), a
// split `per` tiles. lowrank_update: one pass, split by out's columns where the row blocks leave
// SMs idle (each split recomputes x v); where they fill at most 3/4 of the SMs, two passes: h in
// k splits (about two blocks an SM, at least 8 k tiles a split: each split's sums are read again
// by every column split), then out in column splits (as many blocks as the SMs hold at once: one
// wave) that read h's [M, r] sums instead of x. CAT splits x's k tiles (as many as its caller gave
// part room for: lr_cat_splits).
struct LrSplit {
  int64_t per;
  int splits;
};
inline LrSplit lr_split(int64_t tiles, int64_t ask) {
  tiles = std::max<int64_t>(1, tiles), ask = std::clamp<int64_t>(ask, 1, tiles);
  const int64_t per = (tiles + ask - 1) / ask;
  return {per, (int)((tiles + per - 1) / per)};
}

template <typename T, int RT, int W = kLrK, int ST = kLrStages<RT>>
cudaError_t launch_lowrank_mma(const fusedk__lowrank_args &a, cudaStream_t s, int dev) {
  constexpr int WS = kLrShares<RT>;
  const int64_t rows = (a.M + kLrRows - 1) / kLrRows, sms = device_sms(dev), nk = (a.K1 + W - 1) / W,
                nn = (a.K2 + W - 1) / W;
  // ask < 0: the blocks that fit the SMs at once (kLrOut's column splits: one wave)
  auto go = [&](auto kernel, const fusedk__lowrank_args &c, int64_t tiles, int64_t ask) {
    const cudaError_t e = smem_opt_in<decltype(kernel)::value>(LrSmem<RT, W, ST>::kBytes, 0, dev);
    if (e != cudaSuccess) return e;
    if (ask < 0)
      ask = resident_blocks<decltype(kernel)::value>(dev, 128 * WS, LrSmem<RT, W, ST>::kBytes) * sms / rows;
    const LrSplit sp = lr_split(tiles, ask);
    decltype(kernel)::value<<<(unsigned)(rows * sp.splits), 128 * WS, LrSmem<RT, W, ST>::kBytes, s>>>(c, sp.splits,
                                                                                                  (int)sp.per);
    return cudaGetLastError();
  };
#define FUSEDK__LR_KERNEL(VV, P)                                                                                   \
  std::integral_constant<decltype(&lowrank_mma_kernel<T, RT, VV, WS, P, W, ST>),                                   \
                         lowrank_mma_kernel<T, RT, VV, WS, P, W, ST>>{}
  if constexpr (W == kLrK) { // the [x | h] pass: 64-wide tiles
    if (a.mode == FUSEDK__LR_CAT) {
      if (!a.part || a.part_splits < 2) return go(FUSEDK__LR_KERNEL(true, kLrCat), a, 1, 1);
      cudaError_t e = go(FUSEDK__LR_KERNEL(true, kLrCatSplit), a, nk, a.part_splits);
      if (e != cudaSuccess) return e;
      const int64_t n = a.M * a.slots * ((a.r + 7) / 8 * 8);
      lowrank_cat_finish_kernel<T><<<(unsigned)std::min<int64_t>((n + 255) / 256, 8 * sms), 256, 0, s>>>(
          a, lr_split(nk, a.part_splits).splits);
      return cudaGetLastError();
    }
  }
  const bool vv = a.r % 8 == 0 && lr_vec(a.v);
  if (4 * rows <= 3 * sms) {
    fusedk__lowrank_args c = a;
    c.part_splits = lr_split(nk, std::min(2 * sms / rows, nk / 8)).splits; // kLrH's, which kLrOut sums
    // one call's two launches back to back on the stream: threads sharing a stream share its buffer
    std::lock_guard<std::mutex> lock(lr_buffers_order());
    if (lr_buffers().get(dev, s, (size_t)(c.part_splits * a.M * ((a.r + 7) / 8 * 8)) * sizeof(float), 0,
                         reinterpret_cast<void **>(&c.part)) == cudaSuccess) {
      const cudaError_t e = vv ? go(FUSEDK__LR_KERNEL(true, kLrH), c, nk, c.part_splits)
                               : go(FUSEDK__LR_KERNEL(false, kLrH), c, nk, c.part_splits);
      return e != cudaSuccess ? e : go(FUSEDK__LR_KERNEL(true, kLrOut), c, nn, -1);
    }
    cudaGetLastError(); // no buffer (memory, or past 64 streams): the one pass below
  }
  const int64_t ask = (sms + rows - 1) / rows;
  return vv ? go(FUSEDK__LR_KERNEL(true, kLrUpdate), a, nn, ask) : go(FUSEDK__LR_KERNEL(false, kLrUpdate), a, nn, ask);
#undef FUSEDK__LR_KERNEL
}

template <typename T, int RT>
cudaError_t launch_lowrank_grad(const fusedk__lowrank_grad_args &a, float *sv, int64_t ldv, float *su, int64_t ldu,
                                cudaStream_t s, int dev) {
  constexpr int WS = LgPlan<RT>::WS, W = LgPlan<RT>::W, ST = LgPlan<RT>::ST;
  using L = typename LgPlan<RT>::L;
  auto go = [&](auto kernel) {
    const cudaError_t e = smem_opt_in<decltype(kernel)::value>(L::kBytes, 0, dev);
    if (e != cudaSuccess) return e;
    decltype(kernel)::value<<<(unsigned)((a.M + kLrRows - 1) / kLrRows), 128 * WS, L::kBytes, s>>>(a, sv, ldv, su, ldu);
    return cudaGetLastError();
  };
  const bool vv = a.r % 8 == 0 && (a.lora ? lr_vec(a.q) : lr_vec(a.p)); // the [*, r] rows by 16-byte copies
  auto pick = [&](auto lora) {
    constexpr bool LO = decltype(lora)::value;
    if (vv) return go(std::integral_constant<decltype(&lowrank_grad_kernel<T, RT, true, WS, W, ST, LO>), lowrank_grad_kernel<T, RT, true, WS, W, ST, LO>>{});
    return go(std::integral_constant<decltype(&lowrank_grad_kernel<T, RT, false, WS, W, ST, LO>), lowrank_grad_kernel<T, RT, false, WS, W, ST, LO>>{});
  };
  return a.lora ? pick(std::true_type{}) : pick(std::false_type{});
}

template <typename T> cudaError_t launch_lowrank(const fusedk__lowrank_args &a, cudaStream_t s, int dev) {
  if (a.mode == FUSEDK__LR_PREPARE) {
    const int64_t n = a.M * (a.K1 + a.slots * ((a.r + 7) / 8 * 8)), cap = (int64_t)device_sms(dev) * 8;
    lowrank_prepare_kernel<T><<<(unsigned)std::min((n + 255) / 256, cap), 256, 0, s>>>(a);
    return cudaGetLastError();
  }
  // CAT: u_t, y absent; out [M, K1 + A rp], h as wide as A rp (its columns: the rank's place)
  const bool cat = a.mode == FUSEDK__LR_CAT;
  const int width = cat ? a.slots * ((a.r + 7) / 8 * 8) : a.r;
  if constexpr (sizeof(T) == 2) {
    if (a.K1 % 8 == 0 && (cat || a.K2 % 8 == 0) && lr_vec(a.x) && (cat ? lr_vec(a.v) && a.va % 8 == 0 : lr_vec(a.u_t)) &&
        lr_vec(a.out) && (!a.y.p || lr_vec(a.y))) {
      // lowrank_update at rank 16: 128-wide tiles in four stages (half the barriers a byte)
      if (width <= 16) return cat ? launch_lowrank_mma<T, 16>(a, s, dev) : launch_lowrank_mma<T, 16, 128, 4>(a, s, dev);
      if (width <= 32) return launch_lowrank_mma<T, 32>(a, s, dev);
      if (width <= 64) return launch_lowrank_mma<T, 64>(a, s, dev);
      return launch_lowrank_mma<T, 128>(a, s, dev);
    }
  }
  const unsigned grid = (unsigned)((a.M + kLfRows - 1) / kLfRows);
  switch ((width + 31) / 32) {
    case 1: lowrank_fma_kernel<T, 1><<<grid, 256, 0, s>>>(a); break;
    case 2: lowrank_fma_kernel<T, 2><<<grid, 256, 0, s>>>(a); break;
    case 3: lowrank_fma_kernel<T, 3><<<grid, 256, 0, s>>>(a); break;
    default: lowrank_fma_kernel<T, 4><<<grid, 256, 0, s>>>(a); break;
  }
  return cudaGetLastError();
}
#endif // FUSEDK__PART_LOWRANK

// ---------------------------------------------------------------------------------------------
// [conv] conv as an implicit GEMM: rows m = the output pixels (n, t, h, w), columns the Co output
// channels, k = (tap, ci). A k tile is one tap's 64 channels: a row's 128 bytes of A are one
// input pixel's (zeros where the tap falls in the padding), B's the weights of that tap, so the
// im2col matrix is never written. 128x128 tiles, 8 warps of 64x32, three cp.async stages; the
// epilogue adds bias, applies act and the residual in float32 and rounds once. On sm_90a the
// patches TMA can describe run conv_tma_kernel (below conv_kernel).
// ---------------------------------------------------------------------------------------------
#if FUSEDK__PART_CONV
constexpr int kCvM = 128, kCvN = 128, kCvCh = 8, kCvStages = 3, kCvThreads = 256;
constexpr int kCvTile = kCvM * kCvCh * 16; // bytes of one operand's stage (A and B alike)
constexpr int kCvRows = kCvM * kCvCh / kCvThreads; // the A (and B) rows one thread copies a stage

// A pixel of the padded (and upsampled) input: the tap's element offset, or -1 in the zero
// padding. Replicated padding (bit 1 time, bit 2 H and W) reads the nearest frame or edge pixel.
__device__ __forceinline__ int64_t conv_pixel(const fusedk__conv_args &a, int64_t nb, int t, int h, int w) {
  if (a.replicate & 1) t = t < 0 ? 0 : t >= a.T ? (int)a.T - 1 : t;
  if (a.replicate & 2) {
    h = h < 0 ? 0 : h >= a.H ? (int)a.H - 1 : h;
    w = w < 0 ? 0 : w >= a.W ? (int)a.W - 1 : w;
  }
  if (t < 0 || t >= a.T || h < 0 || h >= a.H || w < 0 || w >= a.W) return -1;
  if (a.up > 1) h /= a.up, w /= a.up; // the nearest-upsampled image's pixel in x
  return nb + t * a.xs[1] + h * a.xs[2] + w * a.xs[3];
}

// One thread's 8 elements (16 bytes) of a stage: by cp.async where VEC (every pixel 16-byte
// aligned, Ci a multiple of 8), else element loads and a shared store (visible after the ring's
// next barrier). `off` < 0 or channels past `cols` give zeros.
template <typename T, bool VEC>
__device__ __forceinline__ void conv_chunk(uint32_t dst, const T *base, int64_t off, int cols) {
  if constexpr (VEC) {
    const bool in = off >= 0 && cols > 0;
    cp_async16(dst, in ? base + off : base, in ? 16 : 0);
  } else {
    uint16_t e[8];
    const uint16_t *p = reinterpret_cast<const uint16_t *>(base) + (off < 0 ? 0 : off);
#pragma unroll
    for (int j = 0; j < 8; ++j) e[j] = off >= 0 && j < cols ? p[j] : (uint16_t)0;
    sts_chunk(dst, e);
  }
}

// The 128x128 output tile of block (x, y). WG (sm_90a): two warpgroups of 64 rows each issue
// wgmma over the stage (its rows are the 128-byte-swizzled K-major tiles wgmma reads); else 8
// warps of 64x32 on mma.sync (warp_mma). The same loads and epilogue either way.
template <typename T, bool VEC, bool WG>
__global__ void __launch_bounds__(kCvThreads) conv_kernel(const fusedk__conv_args a) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t sbase = (smem_u32(smem) + 1023) & ~1023u; // wgmma's swizzle atoms: 1024-byte aligned
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t m0 = (int64_t)blockIdx.x * kCvM, n0 = (int64_t)blockIdx.y * kCvN;
  const int64_t M = a.N * a.To * a.Ho * a.Wo, plane = a.Ho * a.Wo, frames = a.To * plane;
  const int chunk = tid % kCvCh, nc = (int)((a.Ci + 63) / 64), nk = (int)(a.kt * a.kh * a.kw) * nc;
  // this thread's A rows (output pixels: their padded input origin) and B rows (output channels)
  int64_t nb[kCvRows];
  int t0[kCvRows], h0[kCvRows], w0[kCvRows];
#pragma unroll
  for (int r = 0; r < kCvRows; ++r) {
    const int64_t m = m0 + tid / kCvCh + r * (kCvThreads / kCvCh);
    const int64_t mm = m < M ? m : 0, n = mm / frames, q = mm % frames, hw = q % plane;
    nb[r] = m < M ? n * a.xs[0] : -1;
    t0[r] = (int)(q / plane) * a.stride_t - a.pad_t, h0[r] = (int)(hw / a.Wo) * a.stride - a.pad;
    w0[r] = (int)(hw % a.Wo) * a.stride - a.pad;
  }
  const T *x = static_cast<const T *>(a.x), *wt = static_cast<const T *>(a.w);
  auto load = [&](int q, int stage) {
    const int tap = q / nc, c = (q % nc) * 64 + chunk * 8, i = tap / (int)(a.kh * a.kw), j = tap / (int)a.kw % (int)a.kh,
              l = tap % (int)a.kw, cols = (int)a.Ci - c;
    const uint32_t sa = sbase + stage * 2 * kCvTile, sb = sa + kCvTile;
#pragma unroll
    for (int r = 0; r < kCvRows; ++r) {
      const int row = tid / kCvCh + r * (kCvThreads / kCvCh);
      const int64_t px = nb[r] < 0 ? -1 : conv_pixel(a, nb[r], t0[r] + i, h0[r] + j, w0[r] + l);
      conv_chunk<T, VEC>(sa + swz<kCvCh>(row, chunk), x, px < 0 ? -1 : px + c, cols);
      const int64_t co = n0 + row;
      conv_chunk<T, VEC>(sb + swz<kCvCh>(row, chunk), wt,
                         co < a.Co ? co * a.ws[0] + i * a.ws[1] + j * a.ws[2] + l * a.ws[3] + c : -1, cols);
    }
  };
  // epilogue of output row m: emit(co, z) for each of the thread's values of that row, with the
  // activation ACT a compile-time constant (with_act: one copy of the epilogue, not a switch each)
  const T *bias = static_cast<const T *>(a.bias), *res = static_cast<const T *>(a.res);
  T *out = static_cast<T *>(a.out);
  auto row_out = [&](auto act, int64_t m, auto &&values) {
    if (m >= M) return;
    const int64_t n = m / frames, q = m % frames, t = q / plane, hw = q % plane, h = hw / a.Wo, w = hw % a.Wo;
    const int64_t o = n * a.os[0] + t * a.os[1] + h * a.os[2] + w * a.os[3];
    const int64_t ro = res ? n * a.rs[0] + t * a.rs[1] + h * a.rs[2] + w * a.rs[3] : 0;
    values([&](int64_t co, float z) {
      if (co >= a.Co) return;
      z = act_16(z + (bias ? to_f32<T>(bias[co]) : 0.f), decltype(act)::value);
      out[o + co] = from_f32<T>(res ? z + to_f32<T>(res[ro + co]) : z);
    });
  };
  if constexpr (WG) {
#if defined(FUSEDK__SM90A)
    // wgmma reads the stages through the async proxy: each thread's copies (and stores) are
    // fenced into it before the barrier that hands the stage over
    const int wg = warp / 4;
    float acc[kCvN / 8][4] = {};
    for (int q = 0; q < kCvStages - 1; ++q) {
      if (q < nk) load(q, q);
      cp_async_commit();
    }
    for (int q = 0; q < nk; ++q) {
      cp_async_wait<kCvStages - 2>();
      fence_async_smem();
      __syncthreads();
      if (q + kCvStages - 1 < nk) load(q + kCvStages - 1, (q + kCvStages - 1) % kCvStages);
      cp_async_commit();
      const uint32_t sa = sbase + (q % kCvStages) * 2 * kCvTile + wg * 64 * 128, sb = sa - wg * 64 * 128 + kCvTile;
      wgmma_hold(acc);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_ss<T, kCvN>(acc, wgmma_desc(sa + kk * 32, 16, 1024), wgmma_desc(sb + kk * 32, 16, 1024), 1);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_hold(acc);
    }
    cp_async_wait<0>();
    with_act(a.act, [&](auto act) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        row_out(act, m0 + wg * 64 + (warp % 4) * 16 + lane / 4 + hf * 8, [&](auto &&emit) {
#pragma unroll
          for (int t = 0; t < kCvN / 8; ++t)
#pragma unroll
            for (int e = 0; e < 2; ++e) emit(n0 + t * 8 + (lane % 4) * 2 + e, acc[t][hf * 2 + e]);
        });
    });
#else
    __trap(); // never launched without sm_90a code (launch_conv's tma_code): loud if it were
#endif
  } else {
    const int wm = warp & 1, wn = warp >> 1;
    float acc[4][4][4] = {};
    const WarpOperand<kCvCh, kA> opa(sbase + wm * 64 * kCvCh * 16, lane);
    const WarpOperand<kCvCh, kB> opb(sbase + kCvTile + wn * 32 * kCvCh * 16, lane);
    ring_run<kCvStages>(nk, load, [&](int, int stage) {
      const uint32_t off = (uint32_t)stage * 2 * kCvTile;
      WarpOperand<kCvCh, kA> sa = opa;
      WarpOperand<kCvCh, kB> sb = opb;
      sa.row += off, sb.row += off;
      warp_mma<T, 4, 2, 4>([&](int i, int t) -> float(&)[4] { return acc[i][t]; }, sa, sb);
    });
    // lane holds rows lane / 4 (+ 8) of each 16-row tile, channel pairs 2 (lane % 4)
    with_act(a.act, [&](auto act) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
          row_out(act, m0 + wm * 64 + i * 16 + lane / 4 + hf * 8, [&](auto &&emit) {
#pragma unroll
            for (int t = 0; t < 4; ++t)
#pragma unroll
              for (int e = 0; e < 2; ++e) emit(n0 + wn * 32 + t * 8 + (lane % 4) * 2 + e, acc[i][t][hf * 2 + e]);
          });
    });
  }
}

// Every element a strided view starts with is on a b-byte boundary: the base and each of the n
// strides (elements of es bytes). vec16: where it holds (and the channels come in 8s), 16-byte
// vectors.
inline bool on_grid(const void *p, const int64_t *st, int n, int64_t es, int64_t b) {
  bool ok = (uintptr_t)p % (uintptr_t)b == 0;
  for (int i = 0; i < n; ++i) ok = ok && st[i] * es % b == 0;
  return ok;
}
inline bool vec16(const void *p, const int64_t *st, int n, int64_t es) { return on_grid(p, st, n, es, 16); }

// the channel tiles (BN) the kernel is built for: the chooser's candidates, the narrowest first
using CvTiles = std::integer_sequence<int, 16, 64, 96, 128, 160, 192, 256>;

// Hopper path (sm_90a, conv_tma_kernel): an output tile is 128 pixels of one frame, a bh x bw
// patch (CvTile: the shape that wastes fewest rows), by BN output channels (16 for an RGB
// conv_out, 64 to 256; 96 for Wan's 96-channel layers). A block an SM walks tiles id, id + grid,
// ... (persistent: the next tile's loads run under this tile's epilogue). A k step is one tap's
// 64 channels: A is the TMA box of the input patch that tap reads (the output patch shifted by
// the tap; TMA loads what falls off the image as zeros, which is the zero padding), B the box of
// the tap's weights; neither an im2col matrix nor a padded copy is ever written. Warpgroup 0's
// first thread issues the boxes into a ring of stages; warpgroups 1 and 2 take 64 rows each
// (wgmma from shared memory) and release a stage once their product of it is done, one product
// staying in flight. A nearest-upsampled input (up > 1) runs as up^2 phases: output pixel
// (up i + ph, up j + pw) reads source pixel i + floor((ph + tap - pad) / up), a box again, so the
// upsampled image is never formed. Time padding that repeats the first frame clamps the box's frame.
// HALO (a 3x3 conv's narrow channel tile, BN 16: an RGB conv_out): a k step is a channel chunk's
// three halo boxes, one a tap column (the patch and the two rows its taps add: at most 10 x 16
// pixels), and its 9 taps' weights; a tap's A is its column's box from the tap's row on, so x is
// read 3 (bh + 2) / bh times a chunk instead of 9
template <int BN, bool HALO = false> struct CvTma {
  static constexpr int kStages = HALO ? 2 : BN == 256 ? 4 : BN >= 160 ? 5 : BN >= 96 ? 6 : BN == 64 ? 8 : 10; // ~192 KB
  // the epilogue's staging: a consumer warp's 16 rows, kCw channels at a time as floats (rows
  // kCw wide, their 16-byte units swizzled: cv_stage)
  static constexpr int kCw = BN < 32 ? BN : 32;
  static constexpr int kA = HALO ? 3 * 160 * 128 : 128 * 128, kStage = kA + (HALO ? 9 : 1) * BN * 128,
                       kBars = kStages * kStage,
                       kEpi = (kBars + 2 * kStages * 8 + 15) / 16 * 16, kBytes = kEpi + 8 * 16 * kCw * 4 + 1024;
  // registers a thread: the launch's, the producer's, and what the producer gives the consumers
  static constexpr int kThreads = 384, kLaunchRegs = 65536 / kThreads / 8 * 8, kProdRegs = 40,
                       kRegs = std::min(240, (kLaunchRegs * 3 - kProdRegs) / 2 / 8 * 8);
  static_assert(kRegs * 2 + kProdRegs <= kLaunchRegs * 3 && kRegs >= kLaunchRegs,
                "setmaxnreg: the consumers' registers come from those the producer releases");
};
// the tiles' order, fastest first: channel tile, patch column, patch row, phase, frame. A cluster of
// CL blocks takes CL neighbouring patches of one channel tile (a "pair": their weight boxes are one)
struct CvTile {
  int64_t tiles_w, tiles_h, patches, pairs;
  int bw, up, gy, vec; // vec: out (and res) take 16-byte vectors of channels
};
// float `col` of row r of a warp's staging rows (CW floats a row): the row's 16-byte unit u sits at
// u ^ f(r % 4), f = 0 3 4 7 (CW 32) or 0 0 3 3 (CW 16), so the epilogue's 8-byte stores (a
// half-warp: 4 rows) and its 16-byte loads (a quarter-warp: 1, 2 or 4 rows) meet no bank twice
template <int CW> __device__ __forceinline__ float *cv_stage(float *sg, int r, int col) {
  const int f = CW == 32 ? (r & 1 ? 3 : 0) ^ (r & 2 ? 4 : 0) : r & 2 ? 3 : 0;
  return sg + r * CW + ((col >> 2 ^ f) << 2) + (col & 3);
}
// a ring of ST stages walked a step at a time: the stage, its phase bit, and whether the ring has
// gone round once (a stage's first use waits for no release)
template <int ST> struct CvRing {
  int s = 0;
  uint32_t ph = 0;
  bool round = false;
  __device__ __forceinline__ int prev() const { return s ? s - 1 : ST - 1; }
  __device__ __forceinline__ void next() {
    if (++s == ST) s = 0, ph ^= 1, round = true;
  }
};

template <typename T, int BN, int CL, bool HALO>
__global__ void __launch_bounds__(CvTma<BN, HALO>::kThreads, 1)
    conv_tma_kernel(const __grid_constant__ CUtensorMap tx, const __grid_constant__ CUtensorMap tw,
                    const fusedk__conv_args a, const CvTile g) {
#if FUSEDK__SM90A
  using L = CvTma<BN, HALO>;
  constexpr int ST = L::kStages, BH = BN / CL; // BH: the weight rows a block loads for the cluster
  extern __shared__ __align__(1024) unsigned char cv_smem[];
  const uint32_t raw = smem_u32(cv_smem), base = (raw + 1023) & ~1023u;
  uint64_t *full = reinterpret_cast<uint64_t *>(cv_smem + (base - raw) + L::kBars), *empty = full + ST;
  if (threadIdx.x == 0) { // empty: a consumer warp each of every block of the cluster (B is shared)
    for (int s = 0; s < ST; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], 8 * CL);
    fence_mbar_init();
  }
  if constexpr (CL > 1) cluster_sync_inits();
  else __syncthreads();
  const int rank = CL > 1 ? (int)cluster_rank() : 0;
  // pair P's channel tile and this block's patch (origin, phase, frame); a patch past the last
  // (the cluster's second block at an odd count) loads its pair's first and stores nothing
  struct At {
    int co0, j0, i0, pw, ph, t, n;
    bool live;
  };
  auto tile = [&](int64_t P) {
    At u;
    u.co0 = (int)(P % g.gy) * BN;
    int64_t id = P / g.gy * CL + rank;
    u.live = id < g.patches;
    if (!u.live) id -= rank;
    u.j0 = (int)(id % g.tiles_w) * g.bw, id /= g.tiles_w;
    u.i0 = (int)(id % g.tiles_h) * (128 / g.bw), id /= g.tiles_h;
    u.pw = (int)(id % g.up), u.ph = (int)(id / g.up % g.up), id /= g.up * g.up;
    u.t = (int)(id % a.To), u.n = (int)(id / a.To);
    return u;
  };
  const int64_t P0 = blockIdx.x / CL, dP = gridDim.x / CL;
  const int nc = (int)((a.Ci + 63) / 64), khw = (int)(a.kh * a.kw), nk = (int)a.kt * (HALO ? 1 : khw) * nc;
  const int hbox = (128 / g.bw + 2) * g.bw * 128; // HALO: a halo box's bytes
  if (threadIdx.x < 128) {
    regs_lower<L::kProdRegs>();
    if (threadIdx.x) return;
    // one thread walks the block's tiles, each tile's taps (frame, row, column) and each tap's
    // channel chunks with counters: a k step costs it a wait, two adds and two copies, so it keeps
    // ahead of the products, and the next tile's stages load under this tile's epilogue
    auto floor_div = [](int v, int d) { return v >= 0 ? v / d : -((-v + d - 1) / d); };
    asm volatile("prefetch.tensormap [%0];" ::"l"(&tx) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(&tw) : "memory");
    CvRing<ST> r;
    for (int64_t P = P0; P < g.pairs; P += dP) {
      const At u = tile(P);
      for (int ti = 0; ti < (int)a.kt; ++ti) {
        int ts = u.t - a.pad_t + ti;
        if (a.replicate & 1) ts = ts < 0 ? 0 : ts >= a.T ? (int)a.T - 1 : ts;
        for (int tp = 0; tp < (HALO ? 1 : khw); ++tp) { // a step's tap (HALO: a step takes all 9)
          const int tj = tp / (int)a.kw, tl = tp % (int)a.kw;
          const int y = u.i0 + floor_div(u.ph + tj - a.pad, g.up), xw = u.j0 + floor_div(u.pw + tl - a.pad, g.up);
          for (int c = 0; c < nc * 64; c += 64, r.next()) {
            if (r.round) mbar_wait(&empty[r.s], r.ph ^ 1);
            const uint32_t sa = base + r.s * L::kStage;
            if constexpr (HALO) { // 3 boxes from row i0 - pad, columns j0 - pad + 0..2; 9 taps' weights
              mbar_expect(&full[r.s], 3 * hbox + 9 * BN * 128);
              for (int k = 0; k < 3; ++k) tma_load_5d(sa + k * hbox, &tx, c, xw + k, y, ts, u.n, &full[r.s]);
              for (int k = 0; k < 9; ++k)
                tma_load_5d(sa + L::kA + k * BN * 128, &tw, c, k % 3, k / 3, ti, u.co0, &full[r.s]);
            } else {
              mbar_expect(&full[r.s], L::kStage);
              tma_load_5d(sa, &tx, c, xw, y, ts, u.n, &full[r.s]);
              if constexpr (CL > 1) // this block's rows of the weight box, into every block's stage
                tma_load_5d_mc(sa + L::kA + rank * BH * 128, &tw, c, tl, tj, ti, u.co0 + rank * BH, &full[r.s],
                               (uint16_t)((1u << CL) - 1));
              else
                tma_load_5d(sa + L::kA, &tw, c, tl, tj, ti, u.co0, &full[r.s]);
            }
          }
        }
      }
    }
    if constexpr (CL > 1) // the other blocks' last releases land before this block's barriers go
      for (int j = 0; j < ST; ++j, r.next())
        if (r.round) mbar_wait(&empty[r.s], r.ph ^ 1);
    return;
  }
  regs_raise<L::kRegs>();
  const int w = threadIdx.x / 128 - 1, lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4;
  const T *bias = static_cast<const T *>(a.bias), *res = static_cast<const T *>(a.res);
  T *out = static_cast<T *>(a.out);
  const int64_t Hp = a.Ho / g.up, Wp = a.Wo / g.up;
  // a stage goes back to the producers of every block of the cluster (each wrote part of it)
  auto release = [&](int st) {
    if (lane) return;
    if constexpr (CL > 1)
      for (int c = 0; c < CL; ++c) mbar_arrive_cta(&empty[st], (uint32_t)c);
    else
      mbar_arrive(&empty[st]);
  };
  CvRing<ST> r;
  float acc[BN / 8][4] = {};
  for (int64_t P = P0; P < g.pairs; P += dP) {
    const At u = tile(P);
    const int co0 = u.co0;
    for (int qt = 0; qt < nk; ++qt, r.next()) {
      mbar_wait(&full[r.s], r.ph);
      const uint32_t sa = base + r.s * L::kStage + w * 64 * 128, sb = base + r.s * L::kStage + L::kA;
      wgmma_fence();
      if constexpr (HALO) { // tap (tj, tl): column tl's box from row tj on (whole 8-row groups)
#pragma unroll
        for (int tp = 0; tp < 9; ++tp)
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)
            wgmma_ss<T, BN>(acc, wgmma_desc(sa + (tp % 3) * hbox + (tp / 3) * g.bw * 128 + kk * 32, 16, 1024),
                            wgmma_desc(sb + tp * BN * 128 + kk * 32, 16, 1024), qt | tp | kk);
      } else {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) // the tile's first product writes acc, the rest add to it
          wgmma_ss<T, BN>(acc, wgmma_desc(sa + kk * 32, 16, 1024), wgmma_desc(sb + kk * 32, 16, 1024), qt | kk);
      }
      wgmma_commit();
      wgmma_wait<1>(); // the previous step's product is done: its stage goes back to the producer
      if (qt) release(r.prev());
    }
    wgmma_wait<0>();
    wgmma_hold(acc);
    release(r.prev());
    if (!u.live) continue;
    // The epilogue. Lane holds rows lane / 4 (+ 8) of its warp's 16 and channel pairs 2 (lane % 4)
    // of each 8; they go through the warp's staging rows (floats: a residual adds to the unrounded
    // activation) kCw channels at a time and come back as 8 neighbouring channels a lane, so a
    // warp's store is 8 rows x 64 whole bytes, not 8 rows x 16 bytes. Compiled once per activation
    constexpr int CW = L::kCw, VR = CW / 8, KS = 16 / (32 / VR); // KS: rows a lane reads back
    float *sg = reinterpret_cast<float *>(cv_smem + (base - raw) + L::kEpi) + (w * 4 + warp) * 16 * CW;
    const int v = lane % VR;
    int64_t o[KS], ro[KS];
    bool on[KS];
#pragma unroll
    for (int k = 0; k < KS; ++k) {
      const int r = w * 64 + warp * 16 + lane / VR + k * (32 / VR), i = u.i0 + r / g.bw, j = u.j0 + r % g.bw;
      const int64_t oh = (int64_t)i * g.up + u.ph, ow = (int64_t)j * g.up + u.pw;
      on[k] = i < Hp && j < Wp;
      o[k] = u.n * a.os[0] + u.t * a.os[1] + oh * a.os[2] + ow * a.os[3];
      ro[k] = res ? u.n * a.rs[0] + u.t * a.rs[1] + oh * a.rs[2] + ow * a.rs[3] : 0;
    }
    // VEC: out and res take 16-byte vectors (a vector's channels all exist or none does)
    auto epilogue = [&](auto act, auto vec) {
      constexpr bool VEC = decltype(vec)::value;
#pragma unroll
      for (int c = 0; c < BN; c += CW) {
        if (co0 + c >= a.Co) break;
#pragma unroll
        for (int c8 = 0; c8 < VR; ++c8) {
          const int co = co0 + c + c8 * 8 + (lane % 4) * 2;
          const float b0 = bias && co < a.Co ? to_f32<T>(bias[co]) : 0.f;
          const float b1 = bias && co + 1 < a.Co ? to_f32<T>(bias[co + 1]) : 0.f;
#pragma unroll
          for (int hf = 0; hf < 2; ++hf)
            *reinterpret_cast<float2 *>(cv_stage<CW>(sg, lane / 4 + hf * 8, c8 * 8 + (lane % 4) * 2)) =
                make_float2(act_16(acc[c / 8 + c8][hf * 2] + b0, decltype(act)::value),
                            act_16(acc[c / 8 + c8][hf * 2 + 1] + b1, decltype(act)::value));
        }
        __syncwarp();
#pragma unroll
        for (int k = 0; k < KS; ++k) {
          const int rr = lane / VR + k * (32 / VR);
          const float4 lo = *reinterpret_cast<const float4 *>(cv_stage<CW>(sg, rr, v * 8)),
                       hi = *reinterpret_cast<const float4 *>(cv_stage<CW>(sg, rr, v * 8 + 4));
          float z[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
          const int co = co0 + c + v * 8;
          if (!on[k]) continue;
          if (VEC) {
            if (co >= a.Co) continue;
            if (res) {
              float q[8];
              load<T, 8>(res + ro[k] + co, q);
#pragma unroll
              for (int e = 0; e < 8; ++e) z[e] += q[e];
            }
            *reinterpret_cast<uint4 *>(out + o[k] + co) =
                make_uint4(pack2<T>(z[0], z[1]), pack2<T>(z[2], z[3]), pack2<T>(z[4], z[5]), pack2<T>(z[6], z[7]));
          } else {
#pragma unroll
            for (int e = 0; e < 8; ++e)
              if (co + e < a.Co) out[o[k] + co + e] = from_f32<T>(z[e] + (res ? to_f32<T>(res[ro[k] + co + e]) : 0.f));
          }
        }
        __syncwarp(); // the staging rows are read before the next chunk writes them
      }
    };
    auto run = [&](auto act) { g.vec ? epilogue(act, std::true_type{}) : epilogue(act, std::false_type{}); };
    with_act(a.act, run);
  }
#else
  __trap(); // never launched without sm_90a code (launch_conv_tma's tma_code): loud if it were
#endif
}

// The Hopper kernel where it applies: sm_90a code on the device, FUSEDK_NO_TMA unset, stride 1,
// zero (or time-replicated) padding, channels in 8s, whole phases (Ho, Wo and x's H, W multiples
// of up), sizes that TMA's int32 coordinates hold, TMA can describe x and w, and the patch tiles
// waste under half their rows. *used says.
template <typename T>
cudaError_t launch_conv_tma(const fusedk__conv_args &a, cudaStream_t s, int dev, bool *used) {
  *used = false;
  const int up = a.up > 1 ? a.up : 1;
  if (tma_disabled() || a.stride != 1 || a.stride_t != 1 || (a.replicate & 2) || a.Ci % 8 ||
      a.H % up || a.W % up || a.Ho % up || a.Wo % up || a.N > INT32_MAX || a.T > INT32_MAX || a.Co > INT32_MAX ||
      a.To > INT32_MAX || a.Ho > INT32_MAX || a.Wo > INT32_MAX)
    return cudaSuccess;
  const int64_t Hp = a.Ho / up, Wp = a.Wo / up;
  CvTile g{};
  g.up = up;
  int64_t best = INT64_MAX;
  for (int bw = 64; bw >= 8; bw /= 2) { // fewest padded rows; ties: the squarer patch (fewer halo reads)
    const int64_t th = (Hp + 128 / bw - 1) / (128 / bw), tw = (Wp + bw - 1) / bw;
    if (th * tw * 128 <= best) best = th * tw * 128, g.tiles_h = th, g.tiles_w = tw, g.bw = bw;
  }
  if (best > 2 * Hp * Wp) return cudaSuccess;
  // the channel tile: the waves of blocks it takes, a wave's time its channels and a fixed 480 more
  // (a block's A reads and its ring's fill and drain, which a narrow tile pays for fewer products: a
  // wide tile feeds the tensor cores better, a narrow one leaves fewer SMs idle in the last wave)
  const int64_t patches = a.N * a.To * up * up * g.tiles_h * g.tiles_w, sms = device_sms(dev);
  auto cost = [&](int c) { return (patches * ((a.Co + c - 1) / c) + sms - 1) / sms * (c + 480); };
  // FUSEDK_CONV_BN=c, one of the tiles, forces it (a sweep of this choice)
  static const long long forced = env_int("FUSEDK_CONV_BN", 0);
  static constexpr auto tiles = int_values(CvTiles{});
  int bn = tiles[0];
  for (int c : tiles)
    if (cost(c) <= cost(bn)) bn = c;
  for (int c : tiles)
    if (forced == c) bn = c;
  g.gy = (int)((a.Co + bn - 1) / bn);
  g.patches = patches;
  // clusters of 2 blocks on neighbouring patches share the weight box (each loads half, multicast):
  // a k step's L2 reads 16 KB + BN x 64 B a block instead of + BN x 128 B. On for 3x3x3 taps, whose
  // 27 k steps a channel block make the weights the larger read; on 2D taps the pair's waits on each
  // other's releases cost more than the L2 reads saved. FUSEDK_CONV_CLUSTER=1 off, =2 on everywhere.
  static const long long cl_env = env_int("FUSEDK_CONV_CLUSTER", 0);
  const bool pair = cl_env == 2 || (cl_env != 1 && a.kt > 1 && a.kh * a.kw > 1);
  const int cl = pair && patches >= 2 && bn >= 64 ? 2 : 1;
  g.pairs = (patches + cl - 1) / cl * g.gy;
  g.vec = a.Co % 8 == 0 && vec16(a.out, a.os, 4, 2) && (!a.res || vec16(a.res, a.rs, 4, 2));
  constexpr bool bf = std::is_same<T, __nv_bfloat16>::value;
  const CUtensorMapDataType ty = bf ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUtensorMap tx, tw;
  const int64_t xd[5] = {a.Ci, a.W / up, a.H / up, a.T, a.N}, xst[4] = {a.xs[3] * 2, a.xs[2] * 2, a.xs[1] * 2, a.xs[0] * 2};
  const int64_t wd[5] = {a.Ci, a.kw, a.kh, a.kt, a.Co}, wst[4] = {a.ws[3] * 2, a.ws[2] * 2, a.ws[1] * 2, a.ws[0] * 2};
  // the halo steps where they apply: a 3x3 tap grid, no upsampling, a 16-channel tile and a patch
  // at most 16 wide (the stage holds its boxes). FUSEDK_CONV_HALO=0 turns them off (a comparison)
  static const bool halo_off = env_is("FUSEDK_CONV_HALO", "0");
  const bool halo = !halo_off && bn == 16 && a.kh == 3 && a.kw == 3 && up == 1 && g.bw <= 16;
  const int xb[5] = {64, g.bw, 128 / g.bw + (halo ? 2 : 0), 1, 1};
  // persistent: a cluster walks pairs P, P + clusters, ...; as many clusters as fit at once
  return dispatch_seq(CvTiles{}, bn, [&](auto bnc) -> cudaError_t {
    // the block's form: 1 or 2 blocks a cluster, or (3) the halo steps, one block (BN 16 only)
    return dispatch_int<1, 2, 3>(halo ? 3 : cl, [&](auto form) -> cudaError_t {
      constexpr int BN = decltype(bnc)::value, CL = decltype(form)::value == 2 && BN >= 64 ? 2 : 1;
      constexpr bool HALO = decltype(form)::value == 3 && BN == 16;
      using L = CvTma<BN, HALO>;
      constexpr auto kernel = conv_tma_kernel<T, BN, CL, HALO>;
      const int wb[5] = {64, 1, 1, 1, BN / CL};
      if (!tma_code<kernel>(dev) || (size_t)L::kBytes > device_smem_optin(dev) ||
          !tmap_nd<5>(&tx, a.x, ty, xd, xst, xb) || !tmap_nd<5>(&tw, a.w, ty, wd, wst, wb))
        return cudaSuccess;
      cudaError_t e = smem_opt_in<kernel>(L::kBytes, 0, dev);
      if (e != cudaSuccess) return e;
      cudaLaunchConfig_t cfg = {};
      cudaLaunchAttribute at[1];
      at[0].id = cudaLaunchAttributeClusterDimension;
      at[0].val.clusterDim.x = CL, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
      cfg.blockDim = dim3(L::kThreads), cfg.dynamicSmemBytes = L::kBytes, cfg.stream = s;
      cfg.attrs = at, cfg.numAttrs = 1;
      int64_t clusters = sms / CL;
      if (CL > 1) {
        cfg.gridDim = dim3((unsigned)(sms / CL * CL));
        const int n = resident_clusters<kernel>(dev, cfg);
        if (n < 1) return cudaSuccess; // no cluster fits (a partitioned device): the cp.async kernel
        clusters = n;
      }
      cfg.gridDim = dim3((unsigned)(std::min(g.pairs, clusters) * CL));
      e = cudaLaunchKernelEx(&cfg, kernel, tx, tw, a, g);
      *used = e == cudaSuccess;
      return e;
    });
  });
}

cudaError_t launch_conv(const fusedk__conv_args &a, cudaStream_t s, int dev) {
  const int64_t M = a.N * a.To * a.Ho * a.Wo;
  const int64_t gx = (M + kCvM - 1) / kCvM, gy = (a.Co + kCvN - 1) / kCvN;
  if (gx > 2147483647 || gy > 65535) return cudaErrorInvalidConfiguration;
  // 16-byte chunks: channels in 8s and every pixel (and w's tap rows) on a 16-byte boundary
  const bool vec = a.Ci % 8 == 0 && vec16(a.x, a.xs, 4, 2) && vec16(a.w, a.ws, 4, 2);
  const size_t smem = (size_t)kCvStages * 2 * kCvTile + 1024;
  const dim3 grid((unsigned)gx, (unsigned)gy);
  return dispatch_scalar(a.scalar, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same<T, float>::value) return cudaErrorInvalidValue; // refused by the entry point
    else {
      auto go = [&](auto kernel) -> cudaError_t {
        cudaError_t e = smem_opt_in<decltype(kernel)::value>(smem, 0, dev);
        if (e) return e;
        decltype(kernel)::value<<<grid, kCvThreads, smem, s>>>(a);
        return cudaGetLastError();
      };
      bool used = false;
      const cudaError_t e = launch_conv_tma<T>(a, s, dev, &used);
      if (e != cudaSuccess || used) return e;
      // FUSEDK_NO_TMA=1: the portable mma.sync kernel on Hopper too (its tests)
      const bool wg = !tma_disabled() && tma_code<conv_kernel<T, true, true>>(dev);
      if (vec) return wg ? go(std::integral_constant<decltype(&conv_kernel<T, true, true>), conv_kernel<T, true, true>>{})
                         : go(std::integral_constant<decltype(&conv_kernel<T, true, false>), conv_kernel<T, true, false>>{});
      return wg ? go(std::integral_constant<decltype(&conv_kernel<T, false, true>), conv_kernel<T, false, true>>{})
                : go(std::integral_constant<decltype(&conv_kernel<T, false, false>), conv_kernel<T, false, false>>{});
    }
  });
}

// fold_batchnorm: one thread an element of w (and of b_out for the first Co threads), in double
__global__ void fold_kernel(const fusedk__fold_args a) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, co = i / (a.R ? a.R : 1), r = i % (a.R ? a.R : 1);
  auto ld = [&](const void *p, int64_t k) -> double {
    if (a.scalar == FUSEDK_F32) return static_cast<const float *>(p)[k];
    if (a.scalar == FUSEDK_F16) return __half2float(static_cast<const __half *>(p)[k]);
    return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[k]);
  };
  auto st = [&](void *p, int64_t k, double v) { // one rounding: double to the dtype directly
    if (a.scalar == FUSEDK_F32) static_cast<float *>(p)[k] = (float)v;
    else if (a.scalar == FUSEDK_F16) static_cast<__half *>(p)[k] = __double2half(v);
    else static_cast<__nv_bfloat16 *>(p)[k] = __double2bfloat16(v);
  };
  const int64_t n = a.R ? a.Co * a.R : a.Co;
  if (i >= n && i >= a.Co) return;
  if (i < a.Co) { // b_out[i]
    const double k = (a.gamma ? ld(a.gamma, i) : 1.0) / sqrt(ld(a.var, i) + (double)a.eps);
    st(a.b_out, i, ((a.bias ? ld(a.bias, i) : 0.0) - ld(a.mean, i)) * k + (a.beta ? ld(a.beta, i) : 0.0));
  }
  if (i < n && a.R) {
    const double k = (a.gamma ? ld(a.gamma, co) : 1.0) / sqrt(ld(a.var, co) + (double)a.eps);
    st(a.w_out, co * a.wos + r, ld(a.w, co * a.ws + r) * k);
  }
}

// group_norm in three launches (x read twice). gn_sums_kernel and gn_apply_kernel share a grid:
// block (n chunks + chunk, z) walks its chunk of pixels, a thread a V-channel vector (vectors z 256
// .. + 256) of one pixel lane, four pixels' loads in flight (gn_walk). The sums: x - K per channel
// in float32 (S1, S2), the lanes of a vector added in a fixed order, then a group's channels (a
// warp, a fixed tree) into part [N, chunks, z, groups]. K: the first element of the group in the
// sample's first pixel, so S2 / n - (S1 / n)^2 keeps its cancellation small wherever a group's
// values sit. gn_stats_kernel: a block a (n, g), the chunks' sums in double, in a fixed order:
// (mean, rstd). The apply: each channel's scale and shift folded once a thread, (x - mean) A + B
// a pixel, the chunks last first (what the sums read last is still in L2).
constexpr int kGnThreads = 256;

__device__ __forceinline__ int gn_lanes(int64_t cv) { return cv >= kGnThreads ? 1 : kGnThreads / (int)cv; }

// the block's (sample, vector, lane) and f(p, x[p]) over its pixels p, in order per thread
struct GnThread {
  int64_t n, v, p0, p1;
  int lanes, pl, cvs; // cvs: the vectors a lane round covers (a pixel's, at most the block's)
  bool on;
};
// rev: the blocks take the chunks last first (the apply reads first what the sums read last, still
// in L2 where x is larger than it)
template <int V>
__device__ __forceinline__ GnThread gn_thread(const fusedk__gn_args &a, int64_t ppc, int64_t chunks, bool rev = false) {
  const int64_t cv = a.C / V, cvs = cv < kGnThreads ? cv : kGnThreads;
  const int64_t b = rev ? a.N * chunks - 1 - blockIdx.x : blockIdx.x, chunk = b % chunks;
  GnThread g;
  g.n = b / chunks, g.lanes = gn_lanes(cv), g.cvs = (int)cvs, g.pl = threadIdx.x / (int)cvs;
  g.v = (int64_t)blockIdx.z * kGnThreads + threadIdx.x % cvs;
  g.on = g.pl < g.lanes && g.v < cv;
  const int64_t e1 = (chunk + 1) * ppc;
  g.p0 = chunk * ppc + g.pl, g.p1 = e1 < a.L ? e1 : a.L;
  return g;
}
// f(p, x[p]) over the pixels p = s + k lanes, k < n (descending where REV), U loads in flight
// as loaded (half the registers of floats for 16-bit T)
template <typename T, int V, int U, bool REV, typename F>
__device__ __forceinline__ void gn_run(const T *x, int64_t xp, int64_t s, int64_t lanes, int64_t n, F &&f) {
  int64_t k = 0;
  for (; k + U <= n; k += U) {
    Raw<T, V> r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) r[u] = ld<T, V>(x + (s + (REV ? n - 1 - k - u : k + u) * lanes) * xp);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float v[V];
      to_floats<T, V>(r[u], v);
      f(s + (REV ? n - 1 - k - u : k + u) * lanes, v);
    }
  }
  for (; k < n; ++k) {
    const int64_t p = s + (REV ? n - 1 - k : k) * lanes;
    float v[V];
    load<T, V>(x + p * xp, v);
    f(p, v);
  }
}
// the k with s + k lanes < e
__device__ __forceinline__ int64_t gn_count(int64_t s, int64_t e, int64_t lanes) { return e > s ? (e - s + lanes - 1) / lanes : 0; }
template <typename T, int V, typename F>
__device__ __forceinline__ void gn_walk(const GnThread &g, const T *x, int64_t xp, F &&f) {
  if (g.on) gn_run<T, V, 4, false>(x, xp, g.p0, g.lanes, gn_count(g.p0, g.p1, g.lanes), f);
}

// a warp's sums of cs [lo, hi) (lanes strided over it, then a fixed tree), in every lane
__device__ __forceinline__ float2 warp_sum2(const float2 *cs, int64_t lo, int64_t hi) {
  float t1 = 0.f, t2 = 0.f;
  for (int64_t c = lo + threadIdx.x % 32; c < hi; c += 32) t1 += cs[c].x, t2 += cs[c].y;
  return make_float2(lanes_sum(t1, 32), lanes_sum(t2, 32));
}
// a group's (mean, rstd) from its sums of x - k over cnt values, in double
__device__ __forceinline__ float2 gn_stat(double s1, double s2, double k, double cnt, float eps) {
  const double m = s1 / cnt, var = fmax(s2 / cnt - m * m, 0.0);
  return make_float2((float)(k + m), (float)(1.0 / sqrt(var + (double)eps)));
}

template <typename T, int V>
__global__ void __launch_bounds__(kGnThreads) gn_sums_kernel(const fusedk__gn_args a, int64_t ppc, int64_t chunks,
                                                             float2 *part) {
  __shared__ float2 red[kGnThreads][V];
  const GnThread g = gn_thread<V>(a, ppc, chunks);
  const int64_t cg = a.C / a.groups;
  const T *x = static_cast<const T *>(a.x) + g.n * a.xs[0];
  float k[V], s1[V] = {}, s2[V] = {};
#pragma unroll
  for (int e = 0; e < V; ++e) k[e] = g.on ? to_f32<T>(x[(g.v * V + e) / cg * cg]) : 0.f;
  gn_walk<T, V>(g, x + g.v * V, a.xs[1], [&](int64_t, const float(&f)[V]) {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float d = f[e] - k[e];
      s1[e] += d, s2[e] = fmaf(d, d, s2[e]);
    }
  });
#pragma unroll
  for (int e = 0; e < V; ++e) red[threadIdx.x][e] = make_float2(s1[e], s2[e]);
  __syncthreads();
  const bool first = g.on && !g.pl; // lane 0 of a vector: its channels' sums over the lanes
  if (first)
    for (int l = 1; l < g.lanes; ++l)
#pragma unroll
      for (int e = 0; e < V; ++e) s1[e] += red[threadIdx.x + l * g.cvs][e].x, s2[e] += red[threadIdx.x + l * g.cvs][e].y;
  __syncthreads();
  float2 *cs = &red[0][0]; // the block's channels c0 + i at cs[i] (lane 0's thread index is its vector's)
  if (first)
#pragma unroll
    for (int e = 0; e < V; ++e) cs[threadIdx.x * V + e] = make_float2(s1[e], s2[e]);
  __syncthreads();
  // a warp a group (its channels in this block), lanes strided over them, then a fixed tree: part
  // [n, chunk, z, group], so the statistics read a few values a group, not one a channel
  const int64_t c0 = (int64_t)blockIdx.z * kGnThreads * V, c1 = c0 + (int64_t)g.cvs * V < a.C ? c0 + (int64_t)g.cvs * V : a.C;
  const int lane = threadIdx.x % 32;
  for (int64_t q = c0 / cg + threadIdx.x / 32; q * cg < c1; q += kGnThreads / 32) {
    const int64_t lo = q * cg > c0 ? q * cg : c0, hi = (q + 1) * cg < c1 ? (q + 1) * cg : c1;
    const float2 t = warp_sum2(cs, lo - c0, hi - c0);
    if (!lane) part[((int64_t)blockIdx.x * gridDim.z + blockIdx.z) * a.groups + q] = t;
  }
}

template <typename T>
__global__ void __launch_bounds__(kGnThreads) gn_stats_kernel(const fusedk__gn_args a, int64_t chunks, int64_t zc,
                                                              const float2 *part, float2 *stats) {
  __shared__ double red[2][kGnThreads];
  const int tid = threadIdx.x;
  const int64_t i = blockIdx.x, n = i / a.groups, g = i % a.groups, cg = a.C / a.groups;
  double s1[4] = {}, s2[4] = {}; // four loads in flight a thread, added in a fixed order
  // the group's sums: a chunk's of each z block its channels meet (part [n, chunk, z, group])
  const int64_t zl = g * cg / zc, nz = ((g + 1) * cg - 1) / zc - zl + 1, zb = (a.C + zc - 1) / zc, nk = chunks * nz;
  for (int64_t k0 = tid; k0 < nk; k0 += 4 * kGnThreads) {
    float2 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t k = k0 + u * kGnThreads;
      v[u] = k < nk ? part[((n * chunks + k / nz) * zb + zl + k % nz) * a.groups + g] : make_float2(0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) s1[u] += v[u].x, s2[u] += v[u].y;
  }
  red[0][tid] = (s1[0] + s1[1]) + (s1[2] + s1[3]), red[1][tid] = (s2[0] + s2[1]) + (s2[2] + s2[3]);
  __syncthreads();
  for (int o = kGnThreads / 2; o > 0; o /= 2) { // a fixed tree: the same bits every run
    if (tid < o) red[0][tid] += red[0][tid + o], red[1][tid] += red[1][tid + o];
    __syncthreads();
  }
  if (tid) return;
  const double k = to_f32<T>(static_cast<const T *>(a.x)[n * a.xs[0] + g * cg]);
  stats[i] = gn_stat(red[0][0], red[1][0], k, (double)a.L * (double)cg, a.eps);
}

// The output's per-channel terms of vector v of sample n: z = ((x - mean) rstd w + b)(1 + scale)
// + shift = (x - mean) A + B; st: the sample's (mean, rstd) a group. put: act(z) into y as T.
template <typename T, int V> struct GnOut {
  float mean[V], A[V], B[V];
  template <int ACT> __device__ __forceinline__ void put(T *y, const float (&f)[V]) const {
    float z[V];
#pragma unroll
    for (int e = 0; e < V; ++e) z[e] = act_t<T>(fmaf(f[e] - mean[e], A[e], B[e]), ACT);
    store_cs<T, V>(y, z);
  }
};
template <typename T, int V>
__device__ __forceinline__ GnOut<T, V> gn_out(const fusedk__gn_args &a, int64_t n, int64_t v, const float2 *st) {
  GnOut<T, V> o;
  const int64_t cg = a.C / a.groups;
  const T *w = static_cast<const T *>(a.weight), *b = static_cast<const T *>(a.bias);
  const T *sc = static_cast<const T *>(a.scale), *sh = static_cast<const T *>(a.shift);
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const int64_t c = v * V + e;
    const float2 t = st[c / cg];
    const float m = sc ? 1.f + to_f32<T>(sc[n * a.ss[0] + c]) : 1.f;
    o.mean[e] = t.x, o.A[e] = t.y * (w ? to_f32<T>(w[c]) : 1.f) * m;
    o.B[e] = (b ? to_f32<T>(b[c]) : 0.f) * m + (sh ? to_f32<T>(sh[n * a.ss[1] + c]) : 0.f);
  }
  return o;
}

template <typename T, int V>
__global__ void __launch_bounds__(kGnThreads) gn_apply_kernel(const fusedk__gn_args a, int64_t ppc, int64_t chunks,
                                                              const float2 *stats) {
  const GnThread g = gn_thread<V>(a, ppc, chunks, true);
  if (!g.on) return;
  const GnOut<T, V> o = gn_out<T, V>(a, g.n, g.v, stats + g.n * a.groups);
  T *y = static_cast<T *>(a.y) + g.n * a.ys[0] + g.v * V;
  with_act(a.act, [&](auto act) {
    gn_walk<T, V>(g, static_cast<const T *>(a.x) + g.n * a.xs[0] + g.v * V, a.xs[1], [&](int64_t p, const float(&f)[V]) {
      o.template put<decltype(act)::value>(y + p * a.ys[1], f);
    });
  });
}

// The held form: one cooperative launch, a block an SM, bps blocks a sample, block b over a run of
// ppb pixels. Pass 1: the run's first `hold` pixels come into shared memory by cp.async (16 bytes
// a thread, no registers held while in flight) while the rest of the run (x past what the SMs
// hold) streams through registers; both add into the sums (x - K, as gn_sums_kernel), whose group
// totals go to part [n, b, groups]. The grid waits (grid.sync); each block reduces its sample's
// parts (a warp a group, double, a fixed order) and writes y: the streamed pixels read again,
// latest first (what pass 1 read last is still in L2), then the held ones from shared memory. x
// comes from DRAM once where the SMs and L2 hold it, in one launch instead of three.
constexpr int kGnHeld = 512; // threads: C / 8 vectors a pixel at most
// shared memory past the held pixels: a float a thread and channel of its vector, a float2 a channel and a group
inline size_t gn_held_scratch(int64_t C, int64_t groups, int V) {
  return (size_t)kGnHeld * V * sizeof(float) + (size_t)(C + groups) * sizeof(float2);
}

template <typename T, int V>
__global__ void __launch_bounds__(kGnHeld, 1) gn_held_kernel(const fusedk__gn_args a, int64_t bps, int64_t ppb,
                                                              int64_t hold, float2 *part) {
  extern __shared__ __align__(16) unsigned char gh_smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t cv = a.C / V, cg = a.C / a.groups, lanes = kGnHeld / cv, pl = tid / cv, v = tid % cv;
  const int64_t n = blockIdx.x / bps, b = blockIdx.x % bps;
  const int64_t p0 = b * ppb < a.L ? b * ppb : a.L, p1 = p0 + ppb < a.L ? p0 + ppb : a.L, ph = p0 + hold < p1 ? p0 + hold : p1;
  T *held = reinterpret_cast<T *>(gh_smem); // [hold][C]
  float *red = reinterpret_cast<float *>(gh_smem + hold * a.C * sizeof(T)); // [kGnHeld][V]
  float2 *chan = reinterpret_cast<float2 *>(red + kGnHeld * V), *gs = chan + a.C; // gs: a group's K, then (mean, rstd)
  const T *xn = static_cast<const T *>(a.x) + n * a.xs[0], *x = xn + v * V;
  // K before the grid waits: y may be x, and another block's pixel 0 may be written by then
  for (int64_t q = tid; q < a.groups; q += kGnHeld) gs[q].x = to_f32<T>(xn[q * cg]);
  __syncthreads();
  const bool on = pl < lanes;
  const int64_t nh = on ? gn_count(p0 + pl, ph, lanes) : 0, ns = on ? gn_count(ph + pl, p1, lanes) : 0;
  T *mine = held + (pl * cv + v) * V; // item q at mine + q lanes C
  for (int64_t q = 0; q < nh; ++q)
    cp_async16((uint32_t)__cvta_generic_to_shared(mine + q * lanes * a.C), x + (p0 + pl + q * lanes) * a.xs[1], 16);
  cp_async_commit();
  float k[V], s1[V] = {}, s2[V] = {};
#pragma unroll
  for (int e = 0; e < V; ++e) k[e] = gs[(v * V + e) / cg].x;
  auto add = [&](int64_t, const float(&f)[V]) {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float d = f[e] - k[e];
      s1[e] += d, s2[e] = fmaf(d, d, s2[e]);
    }
  };
  gn_run<T, V, 4, false>(x, a.xs[1], ph + pl, lanes, ns, add);
  cp_async_wait<0>(); // this thread's copies landed (it alone reads them)
  for (int64_t q = 0; q < nh; ++q) {
    float f[V];
    load<T, V>(mine + q * lanes * a.C, f);
    add(0, f);
  }
  // a channel's sums over the lanes in a fixed order: within a warp by a butterfly where the
  // vectors divide it (lanes i and i + cv hold the same channels), then a warp's totals through
  // shared memory (red [lane][C]), a channel a thread; then a group's (a warp, a fixed tree)
  const int64_t step = cv < 32 && 32 % cv == 0 ? 32 / cv : 1;
  for (int o = 16; step > 1 && o >= cv; o /= 2)
#pragma unroll
    for (int e = 0; e < V; ++e) s1[e] += __shfl_xor_sync(0xffffffffu, s1[e], o), s2[e] += __shfl_xor_sync(0xffffffffu, s2[e], o);
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int e = 0; e < V; ++e) red[tid * V + e] = h ? s2[e] : s1[e]; // = red[pl C + channel]
    __syncthreads();
    for (int64_t c = tid; c < a.C; c += kGnHeld) {
      float t = 0.f;
      for (int64_t l = 0; l < lanes; l += step) t += red[l * a.C + c];
      if (h) chan[c].y = t;
      else chan[c].x = t;
    }
    __syncthreads();
  }
  for (int64_t q = warp; q < a.groups; q += kGnHeld / 32) {
    const float2 t = warp_sum2(chan, q * cg, (q + 1) * cg);
    if (!lane) part[(n * bps + b) * a.groups + q] = t;
  }
  cooperative_groups::this_grid().sync();
  // the sample's statistics: a warp a group, its blocks' parts strided over the lanes, then a
  // fixed butterfly (every lane the same bits)
  for (int64_t q = warp; q < a.groups; q += kGnHeld / 32) {
    double t1 = 0.0, t2 = 0.0;
    for (int64_t j = lane; j < bps; j += 32) {
      const float2 t = __ldcg(&part[(n * bps + j) * a.groups + q]); // L2: written by other blocks
      t1 += t.x, t2 += t.y;
    }
    t1 = lanes_sum(t1, 32), t2 = lanes_sum(t2, 32);
    if (!lane) gs[q] = gn_stat(t1, t2, gs[q].x, (double)a.L * (double)cg, a.eps);
  }
  __syncthreads();
  if (!on) return;
  const GnOut<T, V> o = gn_out<T, V>(a, n, v, gs);
  T *y = static_cast<T *>(a.y) + n * a.ys[0] + v * V;
  with_act(a.act, [&](auto act) {
    auto out = [&](int64_t p, const float(&f)[V]) { o.template put<decltype(act)::value>(y + p * a.ys[1], f); };
    gn_run<T, V, 4, true>(x, a.xs[1], ph + pl, lanes, ns, out);
    for (int64_t q = 0; q < nh; ++q) {
      float f[V];
      load<T, V>(mine + q * lanes * a.C, f);
      out(p0 + pl + q * lanes, f);
    }
  });
}

StreamBuffers &gn_buffers() {
  static StreamBuffers *b = new StreamBuffers; // never destroyed: no teardown order at exit
  return *b;
}

// a sample's L pixels in about `want` chunks (at least one, none below a lane round): the
// pixels a chunk and the chunks
struct GnSplit {
  int64_t ppc, chunks;
};
inline GnSplit gn_split(int64_t L, int64_t lanes, int64_t want) {
  const int64_t c = std::min(std::max<int64_t>(1, want), (L + lanes - 1) / lanes), ppc = (L + c - 1) / c;
  return {ppc, (L + ppc - 1) / ppc};
}

// The held form where it applies: 16-bit x in 16-byte vectors, 64 to 4096 channels, a sample at
// least an SM, cooperative launches. Past the L2 too: what the SMs' shared memory holds is not read
// twice, where the three launches read all of x twice. FUSEDK_GN_HELD=0 turns it off (for a
// comparison). *used says.
template <typename T> cudaError_t launch_gn_held(const fusedk__gn_args &a, cudaStream_t s, int dev, bool *used) {
  *used = false;
  static const bool off = env_is("FUSEDK_GN_HELD", "0");
  constexpr int V = 8;
  const int64_t sms = device_sms(dev), cv = a.C / V, row = a.C * (int64_t)sizeof(T);
  if (off || sizeof(T) != 2 || cv < 8 || cv > kGnHeld || a.N > sms || !device_attr<cudaDevAttrCooperativeLaunch>(dev))
    return cudaSuccess;
  const int64_t bps = sms / a.N, ppb = (a.L + bps - 1) / bps, scratch = (int64_t)gn_held_scratch(a.C, a.groups, V);
  // FUSEDK_GN_HOLD=k: at most k pixels a block held (tests of the streamed part)
  static const int64_t cap = env_int("FUSEDK_GN_HOLD", INT64_MAX);
  const int64_t room = ((int64_t)device_smem_optin(dev) - scratch) / row, hold = std::min({ppb, room, cap});
  if (hold < 1) return cudaSuccess;
  constexpr auto kernel = gn_held_kernel<T, V>;
  const size_t smem = (size_t)(hold * row + scratch);
  // a block an SM fits by construction (smem within the opt-in, 128 registers a thread by the
  // launch bounds), so the cooperative grid of at most one a SM does too on a whole device
  cudaError_t e = smem_opt_in<kernel>(smem, 0, dev);
  if (e != cudaSuccess) return e;
  void *buf = nullptr;
  e = gn_buffers().get(dev, s, (size_t)(a.N * bps * a.groups) * sizeof(float2), 0, &buf);
  if (e != cudaSuccess) return e;
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeCooperative, at[0].val.cooperative = 1;
  cfg.gridDim = dim3((unsigned)(a.N * bps)), cfg.blockDim = dim3(kGnHeld), cfg.dynamicSmemBytes = smem, cfg.stream = s;
  cfg.attrs = at, cfg.numAttrs = 1;
  // refused (a grid that cannot be resident at once where the SMs are partitioned): three launches
  if (cudaLaunchKernelEx(&cfg, kernel, a, bps, ppb, hold, static_cast<float2 *>(buf)) != cudaSuccess)
    return cudaGetLastError(), cudaSuccess;
  *used = true;
  return cudaSuccess;
}

template <typename T, int V> cudaError_t launch_gn(const fusedk__gn_args &a, cudaStream_t s, int dev) {
  if constexpr (V == 8 && sizeof(T) == 2) {
    bool used = false;
    const cudaError_t e = launch_gn_held<T>(a, s, dev, &used);
    if (e != cudaSuccess || used) return e;
  }
  const int64_t cv = a.C / V, zb = (cv + kGnThreads - 1) / kGnThreads, lanes = cv >= kGnThreads ? 1 : kGnThreads / cv;
  const int64_t per = std::max<int64_t>(1, a.N * zb), sms = device_sms(dev);
  // the sums: about four blocks an SM. The apply: at least two waves of the blocks the SMs hold,
  // whole waves where one sample's blocks divide them (a part-filled last wave costs a whole
  // block's time for a few blocks)
  const GnSplit sp = gn_split(a.L, lanes, 4 * sms / per);
  const int64_t full = 2 * resident_blocks<gn_apply_kernel<T, V>>(dev, kGnThreads, 0) * sms;
  const GnSplit ap = gn_split(a.L, lanes, (full + per - 1) / per);
  const int64_t nchunks = sp.chunks, ppc = sp.ppc;
  if (a.N * std::max(nchunks, ap.chunks) > 2147483647 || a.N * a.groups > 2147483647 || zb > 65535)
    return cudaErrorInvalidConfiguration;
  void *buf = nullptr;
  const int64_t np = a.N * nchunks * zb * a.groups; // part [N, chunks, z, groups]
  cudaError_t e = gn_buffers().get(dev, s, (size_t)(np + a.N * a.groups) * sizeof(float2), 0, &buf);
  if (e) return e;
  float2 *pp = static_cast<float2 *>(buf), *stats = pp + np;
  gn_sums_kernel<T, V><<<dim3((unsigned)(a.N * nchunks), 1, (unsigned)zb), kGnThreads, 0, s>>>(a, ppc, nchunks, pp);
  gn_stats_kernel<T><<<(unsigned)(a.N * a.groups), kGnThreads, 0, s>>>(a, nchunks, (int64_t)kGnThreads * V, pp, stats);
  gn_apply_kernel<T, V><<<dim3((unsigned)(a.N * ap.chunks), 1, (unsigned)zb), kGnThreads, 0, s>>>(a, ap.ppc, ap.chunks,
                                                                                                stats);
  return cudaGetLastError();
}

// channel_rmsnorm: G lanes a row (a pixel's channels), G the fewest (a power of two) whose four
// vectors a lane hold the row, so a warp takes 32 / G rows and 96 channels fill its lanes as 768
// do; the row stays in registers between the mean square and the output. A row past 32 lanes' four
// vectors (G = 32, HELD false) is read twice, the second time from L1.
constexpr int kCrmsHeld = 4;
template <typename T, int V, int G, bool HELD> __global__ void crms_kernel(const fusedk__crms_args a) {
  const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / G, nv = a.D / V, rows = a.B * a.L;
  const int sub = threadIdx.x % G;
  const bool live = row < rows; // a dead row's lanes still join the group's shuffles
  const int64_t b = (live ? row : 0) / a.L, l = (live ? row : 0) % a.L;
  const T *x = at<const T>(a.x, b, l);
  T *y = at<T>(a.y, b, l);
  Raw<T, V> held[HELD ? kCrmsHeld : 1];
  float ss = 0.f;
  auto add = [&](const Raw<T, V> &r) {
    float f[V];
    to_floats<T, V>(r, f);
#pragma unroll
    for (int e = 0; e < V; ++e) ss = fmaf(f[e], f[e], ss);
  };
  if constexpr (HELD) {
#pragma unroll
    for (int k = 0; k < kCrmsHeld; ++k)
      if (live && sub + k * G < nv) held[k] = ld<T, V>(x + (sub + k * G) * V);
#pragma unroll
    for (int k = 0; k < kCrmsHeld; ++k)
      if (live && sub + k * G < nv) add(held[k]);
  } else if (live) {
    for (int64_t v = sub; v < nv; v += G) add(ld<T, V>(x + v * V));
  }
  const float ms = lanes_sum(ss, G) / (float)a.D;
  if (!live) return;
  const float r = a.clamp ? 1.f / fmaxf(sqrtf(ms), a.eps) : rsqrtf(ms + a.eps);
  const int64_t n = row / a.P;
  const T *w = static_cast<const T *>(a.weight), *bi = static_cast<const T *>(a.bias);
  const T *sc = a.scale ? static_cast<const T *>(a.scale) + n * a.ss[0] : nullptr;
  const T *sh = a.shift ? static_cast<const T *>(a.shift) + n * a.ss[1] : nullptr;
  auto out = [&](int64_t v, const Raw<T, V> &raw) {
    float f[V];
    to_floats<T, V>(raw, f);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      float z = f[e] * r;
      if (w) z *= to_f32<T>(w[v * V + e]);
      if (bi) z += to_f32<T>(bi[v * V + e]);
      if (sc) z *= 1.f + to_f32<T>(sc[v * V + e]);
      if (sh) z += to_f32<T>(sh[v * V + e]);
      f[e] = z;
    }
    with_act(a.act, [&](auto act) {
#pragma unroll
      for (int e = 0; e < V; ++e) f[e] = act_t<T>(f[e], decltype(act)::value);
    });
    store_cs<T, V>(y + v * V, f);
  };
  if constexpr (HELD) {
#pragma unroll
    for (int k = 0; k < kCrmsHeld; ++k)
      if (sub + k * G < nv) out(sub + k * G, held[k]);
  } else {
    for (int64_t v = sub; v < nv; v += G) out(v, ld<T, V>(x + v * V));
  }
}
#endif // FUSEDK__PART_CONV

} // namespace

// ---------------------------------------------------------------------------------------------
// [entry] the internal entry points fusedk.h's implementation calls
// ---------------------------------------------------------------------------------------------
extern "C" {

// what fusedk__cuda_shutdown (the runtime part) releases, each in its family's part
void fusedk__cuda_gemm_release(void);
void fusedk__cuda_attention_release(void);
void fusedk__cuda_lowrank_release(void);
void fusedk__cuda_conv_release(void);

#if FUSEDK__PART_NORM
#ifdef FUSEDK_TUNING
__attribute__((visibility("default"))) void fusedk__tune_norm_plan(int nv, int g, int rows_per_block) {
  g_tune_plan = NormPlan{nv, g, rows_per_block};
}
#endif

fusedk_status fusedk__cuda_norm(const fusedk__norm_args *a, const char *op, int32_t device_id,
                                struct CUstream_st *stream) {
  return on_device(device_id, op, [&] {
    // the stage may take what the device lets a block opt into, after the reduction slots
    const NormLaunch L{*a, a->B * a->L, stream, device_smem_optin(device_id) - kRedBytes, device_id};
    return dispatch_scalar(a->scalar, [&](auto t) { return launch_norm<typename decltype(t)::type>(L); });
  });
}
#endif // FUSEDK__PART_NORM

#if FUSEDK__PART_ELEMENTWISE
#ifdef FUSEDK_TUNING
// elementwise: vectors a thread (1 or 2) and the most threads a row (32..256); 0 = the library's
__attribute__((visibility("default"))) void fusedk__tune_ew_plan(int u, int g_max) {
  g_tune_ew[0] = u == 1 || u == 2 ? u : 0;
  g_tune_ew[1] = g_max >= 32 && g_max <= 256 && g_max % 32 == 0 ? g_max : 0;
}
#endif

fusedk_status fusedk__cuda_elementwise(const fusedk__ew_args *a, const char *op, int32_t device_id,
                                       struct CUstream_st *stream) {
  return on_device(device_id, op, [&] {
    return dispatch_scalar(a->scalar, [&](auto t) {
      return launch_elementwise<typename decltype(t)::type>(*a, stream);
    });
  });
}
#endif // FUSEDK__PART_ELEMENTWISE

#if FUSEDK__PART_POSITION
fusedk_status fusedk__cuda_rope(const fusedk__rope_args *a, const char *op, int32_t device_id,
                                struct CUstream_st *stream) {
  return on_device(device_id, op, [&] {
    return dispatch_scalar(a->scalar, [&](auto t) {
      using T = typename decltype(t)::type;
      bool used; // Hopper: rows through bulk copies when they apply
      const cudaError_t e = launch_tma<T>(*a, stream, device_id, &used);
      if (used || e != cudaSuccess) return e;
      // rope: thread-per-head-unit kernel (90 us vs 120 for the row kernel at B2 S4096 H24 Dh128)
      if (a->norm == FUSEDK_QK_NORM_NONE && !a->t[2].in && !a->q8) return launch_rope<T>(*a, stream, device_id);
      return launch_qkv<T>(*a, stream, device_id);
    });
  });
}

fusedk_status fusedk__cuda_rope_table(const fusedk__table_args *a, const char *op, int32_t device_id,
                                      struct CUstream_st *stream) {
  return on_device(device_id, op, [&] {
    const int64_t n = a->S * a->H * a->F, need = (n + 255) / 256, cap = (int64_t)device_sms(device_id) * 16;
    rope_table_kernel<<<(unsigned)(need < cap ? need : cap), 256, 0, stream>>>(*a);
    return cudaGetLastError();
  });
}
#endif // FUSEDK__PART_POSITION

#if FUSEDK__PART_LINEAR
fusedk_status fusedk__cuda_linear(const fusedk__linear_args *a, const char *op, int32_t device_id,
                                  struct CUstream_st *stream) {
  return gemm_locked(device_id, op, [&](LtState &st) {
    fusedk_status f = FUSEDK_OK;
    dispatch_scalar(a->scalar, [&](auto t) {
      using T = typename decltype(t)::type;
      f = a->op != FUSEDK_OP_LINEAR_BACKWARD ? linear_forward<T>(st, *a, device_id, stream, op)
                                             : linear_backward<T>(st, *a, device_id, stream, op);
      return cudaSuccess;
    });
    return f;
  });
}

fusedk_status fusedk__cuda_quant(const fusedk__quant_args *a, const char *op, int32_t device_id,
                                 struct CUstream_st *stream) {
  return on_device(device_id, op, [&] {
    return dispatch_scalar(a->scalar, [&](auto t) { return quant_launch<typename decltype(t)::type>(*a, stream); });
  });
}

// [x | h] by the lowrank part's pass into the stream's buffer (16-byte rows), or h alone into x's
// own rows (x with room for h), then linear's GEMM on it over K + A rp
fusedk_status fusedk__cuda_linear_lowrank(const fusedk__linear_args *l, const fusedk__lowrank_args *h, const char *op,
                                          int32_t device_id, struct CUstream_st *stream) {
  return gemm_locked(device_id, op, [&](LtState &st) {
    fusedk__lowrank_args hc = *h;
    fusedk__linear_args lc = *l;
    const bool room = h->out.p != nullptr; // x's rows hold h's columns: no copy of x
    if (!room) hc.out.ld = (l->K + 7) / 8 * 8;
    // [x | h] (unless x has the room), then the k splits' float32 h (lr_cat_splits of them)
    // 256-byte aligned after it
    const size_t xb = room ? 0 : ((size_t)(l->M * hc.out.ld) * (l->scalar == FUSEDK_F32 ? 4 : 2) + 255) / 256 * 256;
    const int splits = l->scalar == FUSEDK_F32 ? 1 : lr_cat_splits(l->M, h->K1, device_id);
    const size_t pb = splits > 1 ? (size_t)(splits * l->M * (l->K - h->K1)) * sizeof(float) : 0;
    void *buf = nullptr;
    if (xb + pb) {
      const cudaError_t e = st.cat.get(device_id, stream, xb + pb, 0, &buf);
      if (e != cudaSuccess) return arena_fail(e, op);
    }
    if (!room) hc.out.p = buf;
    hc.part = pb ? reinterpret_cast<float *>(static_cast<char *>(buf) + xb) : nullptr;
    hc.part_splits = pb ? splits : 1;
    fusedk_status f = fusedk__cuda_lowrank(&hc, op, device_id, stream);
    if (f) return f;
    lc.x = hc.out;
    dispatch_scalar(l->scalar, [&](auto t) {
      f = linear_forward<typename decltype(t)::type>(st, lc, device_id, stream, op);
      return cudaSuccess;
    });
    return f;
  });
}

fusedk_status fusedk__cuda_lowrank_grad(const fusedk__lowrank_grad_args *a, const char *op, int32_t device_id,
                                        struct CUstream_st *stream) {
  return gemm_locked(device_id, op, [&](LtState &st) {
    fusedk_status f = FUSEDK_OK;
    dispatch_scalar(a->scalar, [&](auto t) {
      f = lowrank_grad<typename decltype(t)::type>(st, *a, device_id, stream, op);
      return cudaSuccess;
    });
    return f;
  });
}

void fusedk__cuda_gemm_release(void) { gemm_shutdown(); }
#endif // FUSEDK__PART_LINEAR

#if FUSEDK__PART_ATTENTION
// A call without keys as the 16-bit kernel takes it (it writes 0 and lse -inf, reading q's shape
// alone): attention_int8_scaled's int8 q replaced by out, which has q's shape in the 16-bit type
static fusedk__attn_args keyless(fusedk__attn_args a) {
  if (a.scaled) a.q.p = a.out.p, a.q.sb = a.out.sb, a.q.ss = a.out.ss, a.q.sh = a.out.sh;
  a.int8 = a.scaled = 0;
  return a;
}

fusedk_status fusedk__cuda_attention(const fusedk__attn_args *a, const char *op, int32_t device_id,
                                     struct CUstream_st *stream) {
  return on_device(device_id, op, [&]() -> fusedk_status {
    if (a->int8 && (tma_disabled() || !tma_code<attn_i8_kernel<__nv_bfloat16, 128>>(device_id))) {
      int major = 0, minor = 0;
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_id);
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_id);
      cudaGetLastError();
      return fusedk__fail(FUSEDK_ERR_UNSUPPORTED, "%s: device %d is sm_%d%d%s; the int8 kernel needs sm_90a (H100, "
                          "H200) code", op, (int)device_id, major, minor, tma_disabled() ? " with FUSEDK_NO_TMA set" : "");
    }
    return on_error(dispatch_scalar(a->scalar, [&](auto t) {
      using T = typename decltype(t)::type;
      if constexpr (sizeof(T) == 2)
        return !a->int8 ? launch_attention<T>(*a, stream, device_id)
               : a->Sk == 0 ? launch_attention<T>(keyless(*a), stream, device_id) // 0 and lse -inf, any precision
               : a->Dh == 64  ? launch_attention_i8<T, 64>(*a, stream, device_id)
               : a->Dh == 128 ? launch_attention_i8<T, 128>(*a, stream, device_id)
                              : launch_attention_i8<T, 256>(*a, stream, device_id);
      else return cudaErrorNotSupported; // fusedk.h refuses float32 tensors first
    }), op);
  });
}

void fusedk__cuda_attention_release(void) { attn_buffers().release(), attn_i8_buffers().release(); }
#endif // FUSEDK__PART_ATTENTION

#if FUSEDK__PART_LOWRANK
fusedk_status fusedk__cuda_lowrank(const fusedk__lowrank_args *a, const char *op, int32_t device_id,
                                   struct CUstream_st *stream) {
  return on_device(device_id, op, [&] {
    return dispatch_scalar(a->scalar, [&](auto t) { return launch_lowrank<typename decltype(t)::type>(*a, stream, device_id); });
  });
}

// the backward in one pass, for a call lowrank_grad_fits; sv, su zeroed by the caller
fusedk_status fusedk__cuda_lowrank_grad_pass(const fusedk__lowrank_grad_args *a, float *sv, int64_t ldv, float *su,
                                             int64_t ldu, const char *op, int32_t device_id, struct CUstream_st *stream) {
  if (!lowrank_grad_fits(*a, device_id))
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: the one-pass kernel does not take this call", op);
  return on_device(device_id, op, [&] {
    return dispatch_scalar(a->scalar, [&](auto t) {
      using T = typename decltype(t)::type;
      if constexpr (sizeof(T) == 2) {
        if (a->r <= 16) return launch_lowrank_grad<T, 16>(*a, sv, ldv, su, ldu, stream, device_id);
        if (a->r <= 32) return launch_lowrank_grad<T, 32>(*a, sv, ldv, su, ldu, stream, device_id);
        if (a->r <= 64) return launch_lowrank_grad<T, 64>(*a, sv, ldv, su, ldu, stream, device_id);
        return launch_lowrank_grad<T, 128>(*a, sv, ldv, su, ldu, stream, device_id);
      }
      return cudaErrorNotSupported; // float32 does not fit
    });
  });
}

void fusedk__cuda_lowrank_release(void) { lr_buffers().release(); }
#endif // FUSEDK__PART_LOWRANK

#if FUSEDK__PART_RUNTIME
// Frees every cached cuBLASLt object, workspace, attention, lowrank and group_norm buffer (no work
// in flight).
void fusedk__cuda_shutdown(void) {
  fusedk__cuda_gemm_release();
  fusedk__cuda_attention_release();
  fusedk__cuda_lowrank_release();
  fusedk__cuda_conv_release();
}

// Stream-ordered, from the device's default memory pool: no device-wide synchronization, and
// capturable in a CUDA graph (cudaMalloc is neither).
fusedk_status fusedk__cuda_alloc(int32_t device_id, size_t bytes, struct CUstream_st *stream, void **p) {
  DeviceGuard guard(device_id);
  if (guard.err != cudaSuccess) return cuda_fail(guard.err, "dlpack_alloc", "selecting the device");
  cudaError_t e = cudaMallocAsync(p, bytes ? bytes : 1, stream);
  return e == cudaSuccess ? FUSEDK_OK : cuda_fail(e, "dlpack_alloc", "cudaMallocAsync");
}

void fusedk__cuda_free(int32_t device_id, void *p, struct CUstream_st *stream) {
  DeviceGuard guard(device_id);
  if (cudaFreeAsync(p, stream) != cudaSuccess) cudaGetLastError(); // e.g. at process exit: not sticky
}

fusedk_status fusedk__cuda_stream_wait(int32_t device_id, struct CUstream_st *producer,
                                       struct CUstream_st *consumer) {
  DeviceGuard guard(device_id);
  if (guard.err != cudaSuccess) return cuda_fail(guard.err, "stream_wait", "selecting the device");
  cudaEvent_t ev;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e != cudaSuccess) return cuda_fail(e, "stream_wait", "cudaEventCreate");
  e = cudaEventRecord(ev, producer);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(consumer, ev, 0);
  cudaEventDestroy(ev); // released once the wait has been satisfied
  return e == cudaSuccess ? FUSEDK_OK : cuda_fail(e, "stream_wait", "event record/wait");
}

int fusedk__cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); // clear the sticky "no device" error
    return 0;
  }
  return n;
}

#ifndef __CUDA_ARCH_LIST__
#define __CUDA_ARCH_LIST__ 0
#endif
#define FUSEDK__XSTR(...) #__VA_ARGS__
#define FUSEDK__STR_LIST(...) FUSEDK__XSTR(__VA_ARGS__)

size_t fusedk__cuda_info(char *buf, size_t size) {
  int rt = 0, drv = 0, n = fusedk__cuda_device_count();
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  size_t k = (size_t)snprintf(buf, size,
                              "\"cuda\": {\"built\": true, \"archs\": [%s], \"runtime\": %d, \"driver\": %d, "
                              "\"cublasLt\": %zu, \"devices\": [",
                              FUSEDK__STR_LIST(__CUDA_ARCH_LIST__), rt, drv, cublasLtGetVersion());
  for (int i = 0; i < n && k < size; ++i) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    k += (size_t)snprintf(buf + k, size - k,
                          "%s{\"id\": %d, \"name\": \"%s\", \"cc\": \"%d.%d\", \"sms\": %d, \"memory\": %zu, "
                          "\"l2\": %d}",
                          i ? ", " : "", i, p.name, p.major, p.minor, p.multiProcessorCount, p.totalGlobalMem,
                          p.l2CacheSize);
  }
  if (k < size) k += (size_t)snprintf(buf + k, size - k, "]}");
  return k;
}
#endif // FUSEDK__PART_RUNTIME

#if FUSEDK__PART_CONV
fusedk_status fusedk__cuda_conv(const fusedk__conv_args *a, const char *op, int32_t device_id,
                                struct CUstream_st *stream) {
  return on_device(device_id, op, [&] { return launch_conv(*a, stream, device_id); });
}

fusedk_status fusedk__cuda_group_norm(const fusedk__gn_args *a, const char *op, int32_t device_id,
                                      struct CUstream_st *stream) {
  return on_device(device_id, op, [&] {
    // 16-byte vectors: channels in 8s, every pixel of x and y on a 16-byte boundary
    const int64_t es = a->scalar == FUSEDK_F32 ? 4 : 2;
    const bool vec = a->C % 8 == 0 && vec16(a->x, a->xs, 2, es) && vec16(a->y, a->ys, 2, es);
    return dispatch_scalar(a->scalar, [&](auto t) {
      using T = typename decltype(t)::type;
      return vec ? launch_gn<T, 8>(*a, stream, device_id) : launch_gn<T, 1>(*a, stream, device_id);
    });
  });
}

fusedk_status fusedk__cuda_channel_rmsnorm(const fusedk__crms_args *a, const char *op, int32_t device_id,
                                           struct CUstream_st *stream) {
  return on_device(device_id, op, [&] {
    const int64_t es = a->scalar == FUSEDK_F32 ? 4 : 2, rows = a->B * a->L;
    const int64_t xs[2] = {a->x.sb, a->x.sl}, ys[2] = {a->y.sb, a->y.sl};
    const bool vec = a->D % 8 == 0 && vec16(a->x.p, xs, 2, es) && vec16(a->y.p, ys, 2, es);
    const int64_t nv = vec ? a->D / 8 : a->D;
    int g = 1; // lanes a row: the fewest holding it four vectors a lane, at most a warp
    while (g < 32 && (int64_t)g * kCrmsHeld < nv) g *= 2;
    const int64_t grid = (rows * g + 255) / 256;
    if (grid > INT32_MAX) return cudaErrorInvalidConfiguration;
    const bool held = nv <= (int64_t)g * kCrmsHeld;
    return dispatch_scalar(a->scalar, [&](auto t) {
      using T = typename decltype(t)::type;
      return dispatch_int<1, 8>(vec ? 8 : 1, [&](auto v) {
        return dispatch_int<32, 1, 2, 4, 8, 16>(g, [&](auto gc) {
          constexpr int V = decltype(v)::value, G = decltype(gc)::value;
          if (held) crms_kernel<T, V, G, true><<<(unsigned)grid, 256, 0, stream>>>(*a);
          else crms_kernel<T, V, 32, false><<<(unsigned)grid, 256, 0, stream>>>(*a);
          return cudaGetLastError();
        });
      });
    });
  });
}

fusedk_status fusedk__cuda_fold_batchnorm(const fusedk__fold_args *a, const char *op, int32_t device_id,
                                          struct CUstream_st *stream) {
  return on_device(device_id, op, [&] {
    const int64_t n = std::max(a->Co * a->R, a->Co);
    fold_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(*a);
    return cudaGetLastError();
  });
}

void fusedk__cuda_conv_release(void) { gn_buffers().release(); }
#endif // FUSEDK__PART_CONV

} // extern "C"
