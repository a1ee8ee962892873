// The group_norm variants of call 1 (bench/results/2026-12-07-h100-issue45-b/call1_gn_variants.txt):
// the apply and sums passes alone, against a copy and a read of the same bytes, bf16, N = 1.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o gnb gn_variants.cu && ./gnb
// group_norm apply/sums variants against a copy and a read, bf16, C channels-last, N=1
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
typedef __nv_bfloat16 bf;
__device__ __forceinline__ void ld8(const bf *p, float *f) {
  uint4 u = *reinterpret_cast<const uint4 *>(p);
  const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
  for (int i = 0; i < 4; ++i) { float2 t = __bfloat1622float2(h[i]); f[2 * i] = t.x, f[2 * i + 1] = t.y; }
}
__device__ __forceinline__ void cv8(uint4 u, float *f) {
  const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
  for (int i = 0; i < 4; ++i) { float2 t = __bfloat1622float2(h[i]); f[2 * i] = t.x, f[2 * i + 1] = t.y; }
}
__device__ __forceinline__ void st8(bf *p, const float *f) {
  uint4 u; __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  __stcs(reinterpret_cast<uint4 *>(p), u);
}
__device__ __forceinline__ float silu(float v) { return v * __frcp_rn(1.f + expf(-v)); }
__global__ void copyk(const uint4 *x, uint4 *y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) y[i] = x[i];
}
__global__ void readk(const uint4 *x, int64_t n, unsigned *o) {
  unsigned s = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) s ^= x[i].x ^ x[i].w;
  if (s == 12345u) *o = s;
}
// apply: thread owns a channel vector (8 ch), walks its pixel chunk, U loads in flight; tab [3][C]: mean, A, B
template <int U, int MINB, bool TAB, bool FOLD = false>
__global__ void __launch_bounds__(256, MINB) applyk(const bf *x, bf *y, int C, int64_t L, int64_t ppc, const float *tab,
                                                     const float2 *stats, const bf *w, const bf *b, int cg) {
  const int cv = C / 8, lanes = cv >= 256 ? 1 : 256 / cv, pl = threadIdx.x / cv, v = threadIdx.x % cv;
  if (pl >= lanes) return;
  int64_t p = blockIdx.x * ppc + pl, p1 = min((int64_t)(blockIdx.x + 1) * ppc, L);
  float m[8], A[8], B[8];
  if (TAB) {
    for (int e = 0; e < 8; e += 4) {
      float4 a = *reinterpret_cast<const float4 *>(tab + v * 8 + e), bb = *reinterpret_cast<const float4 *>(tab + C + v * 8 + e),
             c = *reinterpret_cast<const float4 *>(tab + 2 * C + v * 8 + e);
      m[e] = a.x, m[e + 1] = a.y, m[e + 2] = a.z, m[e + 3] = a.w;
      A[e] = bb.x, A[e + 1] = bb.y, A[e + 2] = bb.z, A[e + 3] = bb.w;
      B[e] = c.x, B[e + 1] = c.y, B[e + 2] = c.z, B[e + 3] = c.w;
    }
  } else {
    for (int e = 0; e < 8; ++e) {
      const int c = v * 8 + e; const float2 st = stats[c / cg];
      m[e] = st.x, A[e] = st.y * __bfloat162float(w[c]), B[e] = __bfloat162float(b[c]);
    }
  }
  x += v * 8, y += v * 8;
  for (; p + (U - 1) * lanes < p1; p += U * lanes) {
    uint4 r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) r[u] = __ldcs(reinterpret_cast<const uint4 *>(x + (p + u * lanes) * C));
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float f[8];
      cv8(r[u], f);
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = silu(FOLD ? fmaf(f[e], A[e], B[e]) : fmaf(f[e] - m[e], A[e], B[e]));
      st8(y + (p + u * lanes) * C, f);
    }
  }
  for (; p < p1; p += lanes) {
    float f[8]; ld8(x + p * C, f);
    for (int e = 0; e < 8; ++e) f[e] = silu(fmaf(f[e] - m[e], A[e], B[e]));
    st8(y + p * C, f);
  }
}
// flat: vector i of n, channel vector i % cv; tab read per vector (L1)
template <int U>
__global__ void __launch_bounds__(256) flatk(const bf *x, bf *y, int C, int64_t n, const float *tab) {
  const int cv = C / 8;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x * U;
  for (int64_t i0 = blockIdx.x * (int64_t)blockDim.x * U + threadIdx.x; i0 < n; i0 += stride) {
    float f[U][8];
#pragma unroll
    for (int u = 0; u < U; ++u) { int64_t i = i0 + u * blockDim.x; if (i < n) ld8(x + i * 8, f[u]); }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int64_t i = i0 + u * blockDim.x; if (i >= n) break;
      const int c = (int)(i % cv) * 8;
      for (int e = 0; e < 8; ++e) f[u][e] = silu(fmaf(f[u][e] - __ldg(tab + c + e), __ldg(tab + C + c + e), __ldg(tab + 2 * C + c + e)));
      st8(y + i * 8, f[u]);
    }
  }
}
// sums: thread owns a channel vector, U loads in flight, per-channel partial per block
template <int U>
__global__ void __launch_bounds__(256) sumsk(const bf *x, int C, int64_t L, int64_t ppc, float2 *part) {
  __shared__ float2 red[256][8];
  const int cv = C / 8, lanes = cv >= 256 ? 1 : 256 / cv, pl = threadIdx.x / cv, v = threadIdx.x % cv;
  const bool on = pl < lanes;
  float s1[8] = {}, s2[8] = {}, k[8];
  for (int e = 0; e < 8; ++e) k[e] = __bfloat162float(x[(v * 8 + e) / 16 * 16]);
  int64_t p = blockIdx.x * ppc + pl, p1 = min((int64_t)(blockIdx.x + 1) * ppc, L);
  if (on) {
    x += v * 8;
    for (; p + (U - 1) * lanes < p1; p += U * lanes) {
      uint4 r[U];
#pragma unroll
      for (int u = 0; u < U; ++u) r[u] = *reinterpret_cast<const uint4 *>(x + (p + u * lanes) * C);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float f[8];
        cv8(r[u], f);
#pragma unroll
        for (int e = 0; e < 8; ++e) { float d = f[e] - k[e]; s1[e] += d; s2[e] = fmaf(d, d, s2[e]); }
      }
    }
    for (; p < p1; p += lanes) { float f[8]; ld8(x + p * C, f); for (int e = 0; e < 8; ++e) { float d = f[e] - k[e]; s1[e] += d; s2[e] = fmaf(d, d, s2[e]); } }
  }
  for (int e = 0; e < 8; ++e) red[threadIdx.x][e] = make_float2(s1[e], s2[e]);
  __syncthreads();
  if (!on || pl) return;
  for (int l = 1; l < lanes; ++l) for (int e = 0; e < 8; ++e) s1[e] += red[threadIdx.x + l * cv][e].x, s2[e] += red[threadIdx.x + l * cv][e].y;
  for (int e = 0; e < 8; ++e) part[(int64_t)blockIdx.x * C + v * 8 + e] = make_float2(s1[e], s2[e]);
}
template <typename K> int occ(K k) { int n; cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, 256, 0); return n; }
int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  struct Sh { int C; int64_t L; } shapes[] = {{512, 65536}, {512, 16384}, {256, 262144}, {128, 1048576}};
  bf *x, *y; float *tab; float2 *stats, *part; bf *w; unsigned *o;
  cudaMalloc(&x, 256ll << 20); cudaMalloc(&y, 256ll << 20); cudaMalloc(&tab, 3 * 4096 * 4); cudaMalloc(&stats, 4096 * 8);
  cudaMalloc(&part, 64ll << 20); cudaMalloc(&w, 8192); cudaMalloc(&o, 4);
  cudaMemset(x, 0, 256ll << 20); cudaMemset(tab, 0, 3 * 4096 * 4); cudaMemset(stats, 0, 4096 * 8); cudaMemset(w, 0, 8192);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  auto T = [&](const char *name, double bytes, auto f) {
    for (int i = 0; i < 3; ++i) f();
    std::vector<float> v;
    for (int r = 0; r < 15; ++r) { cudaEventRecord(e0); for (int i = 0; i < 10; ++i) f(); cudaEventRecord(e1); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); v.push_back(ms * 100.f); }
    std::sort(v.begin(), v.end());
    printf("  %-34s %8.1f us %6.0f GB/s %s\n", name, v[7], bytes / v[7] / 1e3, cudaGetErrorString(cudaGetLastError()));
  };
  printf("occupancy: apply<4,1,T> %d apply<4,4,T> %d apply<8,1,T> %d apply<8,3,T> %d apply<4,1,F> %d flat<4> %d sums<4> %d sums<8> %d\n",
         occ(applyk<4, 1, true>), occ(applyk<4, 4, true>), occ(applyk<8, 1, true>), occ(applyk<8, 3, true>), occ(applyk<4, 1, false>), occ(flatk<4>), occ(sumsk<4>), occ(sumsk<8>));
  for (auto s : shapes) {
    const int64_t n = s.L * s.C, nv = n / 8; const double B = n * 2.0;
    printf("C %d L %lld (%.1f MB)\n", s.C, (long long)s.L, B / 1e6);
    T("copy (grid 4/SM x 256)", 2 * B, [&] { copyk<<<sms * 8, 256>>>((const uint4 *)x, (uint4 *)y, nv); });
    T("cudaMemcpy D2D", 2 * B, [&] { cudaMemcpyAsync(y, x, n * 2, cudaMemcpyDeviceToDevice); });
    T("read", B, [&] { readk<<<sms * 8, 256>>>((const uint4 *)x, nv, o); });
    const int cv = s.C / 8, lanes = cv >= 256 ? 1 : 256 / cv;
    auto apply = [&](const char *nm, auto k, int res, int waves) {
      int64_t want = (int64_t)res * sms * waves, ppc = (s.L + want - 1) / want; ppc = (ppc + lanes - 1) / lanes * lanes;
      int64_t ch = (s.L + ppc - 1) / ppc;
      char b[64]; snprintf(b, 64, "%s w%d", nm, waves);
      T(b, 2 * B, [&] { k<<<(unsigned)ch, 256>>>(x, y, s.C, s.L, ppc, tab, stats, w, w, 16); });
    };
    for (int wv : {1, 2, 4}) {
      apply("apply U4 stats", applyk<4, 1, false>, occ(applyk<4, 1, false>), wv);
      apply("apply U4 tab", applyk<4, 1, true>, occ(applyk<4, 1, true>), wv);
      apply("apply U4 tab minb4", applyk<4, 4, true>, occ(applyk<4, 4, true>), wv);
      apply("apply U8 tab", applyk<8, 1, true>, occ(applyk<8, 1, true>), wv);
      apply("apply U8 tab minb3", applyk<8, 3, true>, occ(applyk<8, 3, true>), wv);
      apply("apply U4 fold minb4", applyk<4, 4, true, true>, occ(applyk<4, 4, true, true>), wv);
      apply("apply U8 fold minb4", applyk<8, 4, true, true>, occ(applyk<8, 4, true, true>), wv);
    }
    for (int g : {1, 2, 4}) {
      char b[64]; snprintf(b, 64, "flat U4 grid %d/SM", g * occ(flatk<4>));
      T(b, 2 * B, [&] { flatk<4><<<sms * occ(flatk<4>) * g, 256>>>(x, y, s.C, nv, tab); });
    }
    for (int per : {4, 8, 16}) {
      auto sums = [&](const char *nm, auto k) {
        int64_t want = (int64_t)per * sms, ppc = (s.L + want - 1) / want; ppc = (ppc + lanes - 1) / lanes * lanes;
        int64_t ch = (s.L + ppc - 1) / ppc;
        char b[64]; snprintf(b, 64, "%s %d/SM", nm, per);
        T(b, B, [&] { k<<<(unsigned)ch, 256>>>(x, s.C, s.L, ppc, part); });
      };
      sums("sums U4", sumsk<4>);
      sums("sums U8", sumsk<8>);
    }
  }
  return 0;
}
