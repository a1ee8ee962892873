// fusedk_kernels.cu - every GPU kernel of fusedk and its launcher.
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a
//             -gencode=arch=compute_80,code=[sm_80,compute_80] -c fusedk_kernels.cu
// and define FUSEDK_CUDA in the file that defines FUSEDK_IMPLEMENTATION (see fusedk.h). The
// public entry points live in the header; they validate every argument and hand this file a
// plain, already-checked argument struct, so nothing here re-validates tensors.
//
// defines:
//   runtime glue ....... fusedk__cuda_alloc/free, fusedk__cuda_stream_wait, fusedk__cuda_info,
//                        fusedk__cuda_device_count
//   normalization ...... norm_rows_kernel (rmsnorm, layernorm, adaln, residual_tanh_gated_rmsnorm),
//                        fusedk__cuda_norm (launcher)
#define FUSEDK__KERNELS
#include "fusedk.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>

#include <type_traits>

namespace {

// ---------------------------------------------------------------------------------------------
// Runtime glue
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

// ---------------------------------------------------------------------------------------------
// Element types and 16-byte vectors
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

// VEC elements of T loaded/stored as one access (16 bytes for the vector path, one element for
// the scalar path), converted to/from float registers.
template <typename T, int VEC> struct alignas(sizeof(T) * VEC) Pack { T v[VEC]; };

template <typename T, int VEC> __device__ __forceinline__ Pack<T, VEC> ld(const T *p);

template <typename T, int VEC> __device__ __forceinline__ void load(const T *p, float (&out)[VEC]) {
  const Pack<T, VEC> pk = ld<T, VEC>(p);
#pragma unroll
  for (int i = 0; i < VEC; ++i) out[i] = to_f32<T>(pk.v[i]);
}

// weights and per-sample vectors are re-read by every row: keep them in the read-only cache
template <typename T, int VEC> __device__ __forceinline__ void load_ro(const T *p, float (&out)[VEC]) {
  Pack<T, VEC> pk;
  if constexpr (sizeof(pk) == 16) {
    const uint4 u = __ldg(reinterpret_cast<const uint4 *>(p));
    pk = *reinterpret_cast<const Pack<T, VEC> *>(&u);
  } else {
    pk = *reinterpret_cast<const Pack<T, VEC> *>(p);
  }
#pragma unroll
  for (int i = 0; i < VEC; ++i) out[i] = to_f32<T>(pk.v[i]);
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

// 16-byte stores through __stcs (st.global.cs.v4): NVVM splits a plain vector store into four
// 32-bit ones here (four instructions, partial sectors), and the streaming hint keeps outputs
// that are never re-read from evicting the weights.
template <typename T, int VEC> __device__ __forceinline__ void store(T *p, const float (&in)[VEC]) {
  if constexpr (sizeof(T) == 2 && VEC == 8) {
    __stcs(reinterpret_cast<uint4 *>(p), make_uint4(pack2<T>(in[0], in[1]), pack2<T>(in[2], in[3]),
                                                    pack2<T>(in[4], in[5]), pack2<T>(in[6], in[7])));
  } else if constexpr (sizeof(T) == 4 && VEC == 4) {
    __stcs(reinterpret_cast<float4 *>(p), make_float4(in[0], in[1], in[2], in[3]));
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) p[i] = from_f32<T>(in[i]);
  }
}

template <typename T> __device__ __forceinline__ T *at(const fusedk__rows &r, int64_t b, int64_t l) {
  return static_cast<T *>(r.p) + b * r.sb + l * r.sl;
}

// ---------------------------------------------------------------------------------------------
// Normalization family: one kernel for rmsnorm, layernorm, adaln and Mochi's gated residual.
//
// Launch shape: a group of G threads normalizes one row; a block holds blockDim.y groups.
//   rows of up to 16 vectors per lane: a warp (or an aligned sub-warp) per row, 8 rows per
//     256-thread block, reductions by shuffles alone: no barrier, every warp independent, up
//     to 16 x 16-byte loads in flight per lane;
//   longer rows: a block of G threads per row, warp sums combined through shared memory.
// Memory traffic is the minimum: each input is read once and each output written once while the
// row fits in registers (NV > 0: each thread keeps NV raw 16-byte vectors of x, and of the
// residual when RES, packed, half the registers of floats for 16-bit types). Longer rows
// (NV == 0) are re-read per pass; a row is then small enough to come back from L2.
// Statistics are two-pass from registers (LayerNorm: mean first, then squared deviations).
// ---------------------------------------------------------------------------------------------

// Register budget: ~40 registers of addressing and statistics, plus the cached row, which the
// compiler may keep as floats across the passes (VEC per vector, x and residual). Instantiations
// caching more are capped at fewer threads so that each thread gets what it needs (no spills).
constexpr int cached_floats(int nv, int vec, bool res) { return nv * vec * (res ? 2 : 1); }
constexpr int max_threads(int nv, int vec, bool res) {
  return 48 + cached_floats(nv, vec, res) <= 64 ? 1024 : 48 + cached_floats(nv, vec, res) <= 96 ? 512 : 256;
}
// deeper caches do not fit the 255 registers of a thread
constexpr bool fits(int nv, int vec, bool res) { return cached_floats(nv, vec, res) <= 192; }

// Sum over the G threads of a row group. G <= 32: xor-shuffles inside the aligned lane group;
// G > 32 (a multiple of 32, one group per block row): warp sums, then through shared memory.
__device__ __forceinline__ float group_sum(float v, int G, float *smem) {
  const int width = G < 32 ? G : 32;
  for (int o = width / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o, width);
  if (G <= 32) return v;
  const int warps = G / 32, w = threadIdx.x / 32;
  float *mine = smem + threadIdx.y * warps;
  if ((threadIdx.x & 31) == 0) mine[w] = v;
  __syncthreads();
  float s = 0.f;
  for (int i = 0; i < warps; ++i) s += mine[i];
  return s;
}

template <int NV, typename F> __device__ __forceinline__ void for_each_vec(int64_t nvec, int G, F &&f) {
  const int t = threadIdx.x;
  if constexpr (NV > 0) {
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t j = t + (int64_t)k * G;
      if (j < nvec) f(k, j);
    }
  } else {
    for (int64_t j = t; j < nvec; j += G) f(0, j);
  }
}

template <typename T, int VEC> __device__ __forceinline__ Pack<T, VEC> ld(const T *p) {
  if constexpr (sizeof(Pack<T, VEC>) == 16) { // one 128-bit load, whatever T's copy semantics
    const uint4 u = *reinterpret_cast<const uint4 *>(p);
    return *reinterpret_cast<const Pack<T, VEC> *>(&u);
  } else {
    return *reinterpret_cast<const Pack<T, VEC> *>(p);
  }
}

// An empty asm on the cached words: the compiler may no longer reuse the floats it converted
// in an earlier pass, so only the packed row stays live (half the registers for 16-bit types).
template <typename T, int VEC> __device__ __forceinline__ void opaque(Pack<T, VEC> &pk) {
  if constexpr (sizeof(pk) % 4 == 0) {
    uint32_t *w = reinterpret_cast<uint32_t *>(&pk);
#pragma unroll
    for (int i = 0; i < (int)(sizeof(pk) / 4); ++i) asm volatile("" : "+r"(w[i]));
  } else {
    unsigned short *h = reinterpret_cast<unsigned short *>(&pk);
    asm volatile("" : "+h"(h[0]));
  }
}

template <typename T, int VEC, int NV, bool RES>
__global__ void __launch_bounds__(max_threads(NV, VEC, RES)) norm_rows_kernel(const fusedk__norm_args a, int64_t rows) {
  __shared__ float red[2][32]; // one slot per warp, one array per reduction (no reuse barrier)
  const int G = blockDim.x;
  const int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  const bool live = row < rows; // dead groups still join the block's barriers
  const int64_t b = live ? row / a.L : 0, l = live ? row % a.L : 0;
  const int64_t nvec = live ? a.D / VEC : 0;
  const T *x = at<T>(a.x, b, l);
  const T *res = RES ? at<T>(a.res, b, l) : nullptr;

  constexpr int C = NV > 0 ? NV : 1;
  Pack<T, VEC> cx[C] = {}, cr[RES ? C : 1] = {}; // zeroed: lanes past the row end are never used
  // v = x + res (float, unrounded) for vector j: from registers, or re-read (NV == 0)
  auto fetch = [&](int k, int64_t j, float (&v)[VEC]) {
    Pack<T, VEC> px, pr;
    if constexpr (NV > 0) {
      px = cx[k];
      opaque(px);
      if constexpr (RES) pr = cr[k], opaque(pr);
    } else {
      px = ld<T, VEC>(x + j * VEC);
      if constexpr (RES) pr = ld<T, VEC>(res + j * VEC);
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[i] = RES ? to_f32<T>(px.v[i]) + to_f32<T>(pr.v[i]) : to_f32<T>(px.v[i]);
  };
  if constexpr (NV > 0) { // issue every load of the row before the first use
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t j = threadIdx.x + (int64_t)k * G;
      if (j < nvec) {
        cx[k] = ld<T, VEC>(x + j * VEC);
        if constexpr (RES) cr[k] = ld<T, VEC>(res + j * VEC);
      }
    }
  }

  // LayerNorm sums v - K with K = the row's first element (shifted data): when a row's values
  // sit close together far from zero, mean and v - mean keep their bits in float32
  float K = 0.f;
  if (!a.rms && live) K = to_f32<T>(x[0]) + (RES ? to_f32<T>(res[0]) : 0.f);

  // pass 1: sum v - K (LayerNorm) or v^2 (RMSNorm)
  float s1 = 0.f;
  for_each_vec<NV>(nvec, G, [&](int k, int64_t j) {
    float v[VEC];
    fetch(k, j, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) s1 += a.rms ? v[i] * v[i] : v[i] - K;
  });
  s1 = group_sum(s1, G, red[0]);
  const float inv_d = 1.f / (float)a.D;
  float dm = 0.f, var; // dm = mean - K
  if (a.rms) {
    var = a.exact ? s1 / (float)a.D : s1 * inv_d;
  } else {
    dm = s1 * inv_d;
    float s2 = 0.f;
    for_each_vec<NV>(nvec, G, [&](int k, int64_t j) {
      float v[VEC];
      fetch(k, j, v);
#pragma unroll
      for (int i = 0; i < VEC; ++i) s2 += ((v[i] - K) - dm) * ((v[i] - K) - dm);
    });
    var = group_sum(s2, G, red[1]) * inv_d;
  }
  const float rstd = rsqrtf(var + a.eps);

  // final pass: epilogue and stores
  T *y = at<T>(a.y, b, l);
  T *ro = RES && a.res_out.p ? at<T>(a.res_out, b, l) : nullptr;
  const T *base = a.base.p ? at<T>(a.base, b, l) : nullptr;
  const T *sc = a.scale.p ? at<T>(a.scale, b, 0) : nullptr;
  const T *sh = a.shift.p ? at<T>(a.shift, b, 0) : nullptr;
  const T *g = a.gate.p ? at<T>(a.gate, b, 0) : nullptr;
  const T *w = static_cast<const T *>(a.weight), *bi = static_cast<const T *>(a.bias);
  for_each_vec<NV>(nvec, G, [&](int k, int64_t j) {
    float v[VEC], n[VEC], p[VEC];
    fetch(k, j, v);
    const int64_t d = j * VEC;
    if (RES && ro) store<T, VEC>(ro + d, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) n[i] = ((v[i] - K) - dm) * rstd; // RMS: K = dm = 0, exactly v * rstd
    if (w) {
      load_ro<T, VEC>(w + d, p);
#pragma unroll
      for (int i = 0; i < VEC; ++i) n[i] *= p[i];
    }
    if (bi) {
      load_ro<T, VEC>(bi + d, p);
#pragma unroll
      for (int i = 0; i < VEC; ++i) n[i] += p[i];
    }
    if (sc) {
      load_ro<T, VEC>(sc + d, p);
#pragma unroll
      for (int i = 0; i < VEC; ++i) n[i] *= 1.f + p[i];
    }
    if (sh) {
      load_ro<T, VEC>(sh + d, p);
#pragma unroll
      for (int i = 0; i < VEC; ++i) n[i] += p[i];
    }
    if (g) {
      load_ro<T, VEC>(g + d, p);
#pragma unroll
      for (int i = 0; i < VEC; ++i) n[i] *= a.exact ? round_to<T>(tanhf(p[i])) : tanhf(p[i]);
    }
    if (base) {
      load<T, VEC>(base + d, p);
#pragma unroll
      for (int i = 0; i < VEC; ++i) n[i] = (a.exact ? round_to<T>(n[i]) : n[i]) + p[i];
    }
    store<T, VEC>(y + d, n);
  });
}

// The launch shape for rows of nvec vectors: NV vectors cached per thread, G threads per row.
struct NormPlan {
  int nv, g, rows_per_block;
};

constexpr int kWarpNV[] = {1, 2, 4, 8}; // cache depths of the warp-per-row shape

NormPlan plan_norm(int64_t nvec, int vec, bool res) {
  NormPlan p{0, 0, 1};
  if (nvec <= 32 * 8) { // a warp (or sub-warp) per row
    int g = 1;
    while (g < 32 && g < nvec) g *= 2;
    const int64_t per = (nvec + g - 1) / g;
    for (int nv : kWarpNV)
      if (nv >= per && fits(nv, vec, res)) {
        p.nv = nv;
        p.g = g;
        p.rows_per_block = 256 / g;
        return p;
      }
  }
  for (int nv : {4, 8, 16}) { // a block per row: the smallest cache whose thread cap fits the row
    const int64_t g = (nvec + nv - 1) / nv;
    if (fits(nv, vec, res) && g <= max_threads(nv, vec, res)) {
      p.nv = nv;
      p.g = (int)((g + 31) / 32 * 32);
      return p;
    }
  }
  p.g = 512; // re-read from L2
  return p;
}

// bench/tune_norm.py sets a launch shape through fusedk__tune_norm_plan (not API, not thread
// safe: a measuring aid); one that does not fit the row is ignored.
NormPlan g_tune_plan{-1, 0, 0};

bool plan_valid(const NormPlan &p, int64_t nvec, int vec, bool res) {
  const bool gok = p.g > 32 ? p.g % 32 == 0 : (p.g & (p.g - 1)) == 0;
  const bool nvok = p.nv == 0 || p.nv == 1 || p.nv == 2 || p.nv == 4 || p.nv == 8 || p.nv == 16;
  return gok && nvok && p.g >= 1 && p.rows_per_block >= 1 && p.g * p.rows_per_block <= max_threads(p.nv, vec, res) &&
         (p.g >= 32 || p.rows_per_block * p.g % 32 == 0) &&
         (p.nv == 0 || (int64_t)p.nv * p.g >= nvec) && (p.nv == 0 || fits(p.nv, vec, res));
}

template <typename T, int VEC, bool RES>
cudaError_t launch_norm_vec(const fusedk__norm_args &a, int64_t rows, cudaStream_t s) {
  NormPlan p = plan_norm(a.D / VEC, VEC, RES);
  if (g_tune_plan.nv >= 0 && plan_valid(g_tune_plan, a.D / VEC, VEC, RES)) p = g_tune_plan;
  const dim3 block(p.g, p.rows_per_block);
  const int64_t grid = (rows + p.rows_per_block - 1) / p.rows_per_block;
  if (grid > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const unsigned gr = (unsigned)grid;
  auto go = [&](auto nv) { // instantiates only the cache depths that fit (plan never picks others)
    constexpr int NV = decltype(nv)::value;
    if constexpr (NV == 0 || fits(NV, VEC, RES)) norm_rows_kernel<T, VEC, NV, RES><<<gr, block, 0, s>>>(a, rows);
  };
  switch (p.nv) {
    case 1: go(std::integral_constant<int, 1>()); break;
    case 2: go(std::integral_constant<int, 2>()); break;
    case 4: go(std::integral_constant<int, 4>()); break;
    case 8: go(std::integral_constant<int, 8>()); break;
    case 16: go(std::integral_constant<int, 16>()); break;
    default: go(std::integral_constant<int, 0>()); break;
  }
  return cudaGetLastError();
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

// 16-byte vectors need every pointer 16-byte aligned, every row stride and D a multiple of
// the vector; otherwise the scalar path (same kernel, one element per access).
template <typename T> cudaError_t launch_norm(const fusedk__norm_args &a, int64_t rows, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  bool vec = a.D % V == 0 && aligned16(a.weight) && aligned16(a.bias);
  for (const fusedk__rows *r : {&a.x, &a.res, &a.res_out, &a.y, &a.base, &a.scale, &a.shift, &a.gate})
    vec = vec && aligned16(r->p) && r->sb % V == 0 && r->sl % V == 0;
  if (a.res.p) return vec ? launch_norm_vec<T, V, true>(a, rows, s) : launch_norm_vec<T, 1, true>(a, rows, s);
  return vec ? launch_norm_vec<T, V, false>(a, rows, s) : launch_norm_vec<T, 1, false>(a, rows, s);
}

const char *op_of(const fusedk__norm_args *a) {
  return a->gate.p ? "residual_tanh_gated_rmsnorm" : a->scale.p ? "adaln" : a->rms ? "rmsnorm" : "layernorm";
}

} // namespace

// ---------------------------------------------------------------------------------------------
// Internal entry points called from fusedk.h's implementation
// ---------------------------------------------------------------------------------------------
extern "C" {

__attribute__((visibility("default"))) void fusedk__tune_norm_plan(int nv, int g, int rows_per_block) {
  g_tune_plan = NormPlan{nv, g, rows_per_block};
}

fusedk_status fusedk__cuda_norm(const fusedk__norm_args *a, int32_t device_id, struct CUstream_st *stream) {
  DeviceGuard guard(device_id);
  if (guard.err != cudaSuccess) return cuda_fail(guard.err, op_of(a), "selecting the device");
  const int64_t rows = a->B * a->L;
  cudaError_t e = cudaErrorInvalidValue;
  switch (a->scalar) {
    case FUSEDK_F32: e = launch_norm<float>(*a, rows, stream); break;
    case FUSEDK_F16: e = launch_norm<__half>(*a, rows, stream); break;
    case FUSEDK_BF16: e = launch_norm<__nv_bfloat16>(*a, rows, stream); break;
  }
  return e == cudaSuccess ? FUSEDK_OK : cuda_fail(e, op_of(a), "kernel launch");
}

fusedk_status fusedk__cuda_alloc(int32_t device_id, size_t bytes, void **p) {
  DeviceGuard guard(device_id);
  if (guard.err != cudaSuccess) return cuda_fail(guard.err, "dlpack_alloc", "selecting the device");
  cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
  return e == cudaSuccess ? FUSEDK_OK : cuda_fail(e, "dlpack_alloc", "cudaMalloc");
}

// cudaFree waits for the device: safe whichever stream last used the memory
void fusedk__cuda_free(int32_t device_id, void *p) {
  DeviceGuard guard(device_id);
  cudaFree(p);
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

} // extern "C"
