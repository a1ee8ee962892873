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

template <typename T, int VEC> __device__ __forceinline__ void load(const T *p, float (&out)[VEC]) {
  const Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC> *>(p);
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

template <typename T, int VEC> __device__ __forceinline__ void store(T *p, const float (&in)[VEC]) {
  Pack<T, VEC> pk;
#pragma unroll
  for (int i = 0; i < VEC; ++i) pk.v[i] = from_f32<T>(in[i]);
  *reinterpret_cast<Pack<T, VEC> *>(p) = pk;
}

template <typename T> __device__ __forceinline__ T *at(const fusedk__rows &r, int64_t b, int64_t l) {
  return static_cast<T *>(r.p) + b * r.sb + l * r.sl;
}

// ---------------------------------------------------------------------------------------------
// Normalization family: one kernel for rmsnorm, layernorm, adaln and Mochi's gated residual.
//
// Launch shape: a group of G threads normalizes one row; a block holds blockDim.y groups
// (blockDim = (G, 256/G) for small rows, (G, 1) otherwise). Memory traffic is the minimum: each
// input element is read once and each output written once when the row fits in registers
// (NV > 0: every thread keeps NV vectors of VEC elements as floats). For rows too long for
// that (NV == 0) the row is re-read per pass; it is then small enough to come back from L2.
// Statistics are exact two-pass (mean first, then squared deviations from registers).
// ---------------------------------------------------------------------------------------------

constexpr int kMaxNV = 8;
// A thread caching 32+ floats of row needs more than the 64 registers a 1024-thread block
// leaves it: such instantiations are capped at 512 threads (128 registers, no spills).
constexpr int max_threads(int nv, int vec) { return nv * vec >= 32 ? 512 : 1024; }

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

template <typename T, int VEC, int NV>
__global__ void __launch_bounds__(max_threads(NV, VEC)) norm_rows_kernel(const fusedk__norm_args a, int64_t rows) {
  __shared__ float red[2][32]; // one slot per warp, one array per reduction (no reuse barrier)
  const int G = blockDim.x;
  const int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  const bool live = row < rows; // dead groups still join the block's barriers
  const int64_t b = live ? row / a.L : 0, l = live ? row % a.L : 0;
  const int64_t nvec = live ? a.D / VEC : 0;
  const T *x = at<T>(a.x, b, l);
  const T *res = a.res.p ? at<T>(a.res, b, l) : nullptr;

  float cache[NV > 0 ? NV : 1][VEC];
  // v = x + res for vector j: from registers, or from memory on the re-reading path
  auto fetch = [&](int k, int64_t j, float (&v)[VEC]) {
    if constexpr (NV > 0) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] = cache[k][i];
    } else {
      load<T, VEC>(x + j * VEC, v);
      if (res) {
        float r[VEC];
        load<T, VEC>(res + j * VEC, r);
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[i] += r[i];
      }
    }
  };

  // LayerNorm sums v - K with K = the row's first element (shifted data): when a row's values
  // sit close together far from zero, mean and v - mean keep their bits in float32
  float K = 0.f;
  if (!a.rms && live) K = to_f32<T>(x[0]) + (res ? to_f32<T>(res[0]) : 0.f);

  // pass 1: load (into registers) and sum v - K (LayerNorm) or v^2 (RMSNorm)
  float s1 = 0.f;
  for_each_vec<NV>(nvec, G, [&](int k, int64_t j) {
    float v[VEC];
    if constexpr (NV > 0) {
      load<T, VEC>(x + j * VEC, cache[k]);
      if (res) {
        float r[VEC];
        load<T, VEC>(res + j * VEC, r);
#pragma unroll
        for (int i = 0; i < VEC; ++i) cache[k][i] += r[i];
      }
    }
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
  T *ro = a.res_out.p ? at<T>(a.res_out, b, l) : nullptr;
  const T *base = a.base.p ? at<T>(a.base, b, l) : nullptr;
  const T *sc = a.scale.p ? at<T>(a.scale, b, 0) : nullptr;
  const T *sh = a.shift.p ? at<T>(a.shift, b, 0) : nullptr;
  const T *g = a.gate.p ? at<T>(a.gate, b, 0) : nullptr;
  const T *w = static_cast<const T *>(a.weight), *bi = static_cast<const T *>(a.bias);
  for_each_vec<NV>(nvec, G, [&](int k, int64_t j) {
    float v[VEC], n[VEC], p[VEC];
    fetch(k, j, v);
    const int64_t d = j * VEC;
    if (ro) store<T, VEC>(ro + d, v);
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

// Rows of nvec vectors: NV vectors per thread in registers and G threads per row. Prefers
// G <= 256 (short reductions, several rows per SM) and NV as small as that allows (more
// threads, more loads in flight). NV = 0 when the row does not fit in registers at all.
struct NormPlan {
  int nv, g, rows_per_block;
};

NormPlan plan_norm(int64_t nvec, int vec) {
  NormPlan p{0, max_threads(0, vec), 1};
  for (int nv = 1; nv <= kMaxNV; nv *= 2) {
    const int64_t g = (nvec + nv - 1) / nv;
    if (g <= 256 || (nv == kMaxNV && g <= max_threads(nv, vec))) {
      p.nv = nv;
      if (g <= 32) {
        int gg = 1;
        while (gg < g) gg *= 2;
        p.g = gg < 4 ? 4 : gg;
      } else {
        p.g = (int)((g + 31) / 32 * 32);
      }
      break;
    }
  }
  p.rows_per_block = p.g < 256 ? 256 / p.g : 1;
  return p;
}

template <typename T, int VEC>
cudaError_t launch_norm_vec(const fusedk__norm_args &a, int64_t rows, cudaStream_t s) {
  const NormPlan p = plan_norm(a.D / VEC, VEC);
  const dim3 block(p.g, p.rows_per_block);
  const int64_t grid = (rows + p.rows_per_block - 1) / p.rows_per_block;
  if (grid > 0x7fffffff) return cudaErrorInvalidConfiguration;
  switch (p.nv) {
    case 1: norm_rows_kernel<T, VEC, 1><<<(unsigned)grid, block, 0, s>>>(a, rows); break;
    case 2: norm_rows_kernel<T, VEC, 2><<<(unsigned)grid, block, 0, s>>>(a, rows); break;
    case 4: norm_rows_kernel<T, VEC, 4><<<(unsigned)grid, block, 0, s>>>(a, rows); break;
    case 8: norm_rows_kernel<T, VEC, 8><<<(unsigned)grid, block, 0, s>>>(a, rows); break;
    default: norm_rows_kernel<T, VEC, 0><<<(unsigned)grid, block, 0, s>>>(a, rows); break;
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
  return vec ? launch_norm_vec<T, V>(a, rows, s) : launch_norm_vec<T, 1>(a, rows, s);
}

const char *op_of(const fusedk__norm_args *a) {
  return a->gate.p ? "residual_tanh_gated_rmsnorm" : a->scale.p ? "adaln" : a->rms ? "rmsnorm" : "layernorm";
}

} // namespace

// ---------------------------------------------------------------------------------------------
// Internal entry points called from fusedk.h's implementation
// ---------------------------------------------------------------------------------------------
extern "C" {

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
