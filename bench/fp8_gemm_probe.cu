// Which FP8 (e4m3) scalings cuBLASLt's heuristic offers on this GPU, and how fast each runs at the
// DiT GEMMs, against the bf16 GEMM of the same shape: the evidence for fusedk's FP8 linear.
// y[M, N] = x[M, K] w[N, K]^T, called as fusedk calls cuBLASLt: column major y^T = op_T(w) x^T,
// so A = w (its scales: one an output channel, OUTER_VEC's "M" vector) and B = x (one a token
// row, OUTER_VEC's "N" vector). Scalings:
//   tensor     one float32 scale each (SCALAR_32F)
//   outer      a scale per output channel of w and per row of x (OUTER_VEC_32F: torchao's PerRow)
//   blk        x per 1x128 block of a row (VEC128_32F), w per 128x128 block (BLK128x128_32F)
// each with the default (promoted) accumulation and, where offered, FAST_ACCUM. Epilogues BIAS and
// GELU_BIAS (bf16 bias) under outer. A check at 512x1024x768 against a float64 host product of
// the decoded e4m3 inputs tells the outer vectors' orientation. Timing: the heuristic's first 8
// candidates (no reduction-scheme preference) picked as lt_search picks (lt_common.h), then every
// pick in 7 rotated rounds of 8 launches, median.
//   nvcc -O2 -arch=sm_90a -o fp8_gemm_probe bench/fp8_gemm_probe.cu -lcublasLt && ./fp8_gemm_probe
#include "lt_common.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

enum Kind { BF16, TENSOR, OUTER, BLK };

struct Gemm {
  int64_t M, K, N;
  Kind kind;
  int fast;
  cublasLtEpilogue_t epi;
  void *x, *w, *y, *bias, *sx, *sw;
  cublasLtMatmulDesc_t d;
  cublasLtMatrixLayout_t a, b, dd;
};

static bool describe(Gemm &g) {
  CK(cublasLtMatmulDescCreate(&g.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t T = CUBLAS_OP_T, N = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_TRANSA, &T, sizeof T));
  CK(cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_TRANSB, &N, sizeof N));
  CK(cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epi, sizeof g.epi));
  if (g.epi != CUBLASLT_EPILOGUE_DEFAULT) {
    const cudaDataType_t bt = CUDA_R_16BF;
    CK(cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
    if (g.kind != BF16) CK(cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
  }
  const cudaDataType_t in = g.kind == BF16 ? CUDA_R_16BF : CUDA_R_8F_E4M3;
  if (g.kind != BF16) {
    const int32_t ma = g.kind == TENSOR ? CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F
                       : g.kind == OUTER ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                                         : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const int32_t mb = g.kind == BLK ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : ma;
    const int8_t fast = (int8_t)g.fast;
    if (cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma) ||
        cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb))
      return false;
    CK(cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.sw, sizeof g.sw));
    CK(cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.sx, sizeof g.sx));
    CK(cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
  }
  CK(cublasLtMatrixLayoutCreate(&g.a, in, g.K, g.N, g.K));
  CK(cublasLtMatrixLayoutCreate(&g.b, in, g.K, g.M, g.K));
  CK(cublasLtMatrixLayoutCreate(&g.dd, CUDA_R_16BF, g.N, g.M, g.N));
  return true;
}

__device__ uint32_t hash(uint64_t i, uint32_t seed) {
  uint32_t h = (uint32_t)i * 2654435761u ^ (uint32_t)(i >> 32) ^ seed;
  h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
  return h;
}
__global__ void fill_bf16(__nv_bfloat16 *p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = __float2bfloat16(((hash(i, seed) & 0xffff) / 65536.f - 0.5f) * scale);
}
__global__ void fill_fp8(__nv_fp8_e4m3 *p, int64_t n, uint32_t seed) { // uniform in +-400
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = __nv_fp8_e4m3(((hash(i, seed) & 0xffff) / 65536.f - 0.5f) * 800.f);
}
__global__ void fill_f32(float *p, int64_t n, uint32_t seed) { // positive scales, 0.5..1.5 / 400
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = (0.5f + (hash(i, seed) & 0xffff) / 65536.f) / 400.f;
}

static void alloc(Gemm &g) {
  const size_t e = g.kind == BF16 ? 2 : 1, ns = (size_t)((g.K + 127) / 128) * (size_t)(std::max(g.M, g.N) + 128);
  CK(cudaMalloc(&g.x, g.M * g.K * e));
  CK(cudaMalloc(&g.w, g.N * g.K * e));
  CK(cudaMalloc(&g.y, g.M * g.N * 2));
  CK(cudaMalloc(&g.bias, g.N * 2));
  CK(cudaMalloc(&g.sx, ns * 4));
  CK(cudaMalloc(&g.sw, ns * 4));
  if (g.kind == BF16) {
    fill_bf16<<<1024, 256>>>((__nv_bfloat16 *)g.x, g.M * g.K, 1, 3.4f);
    fill_bf16<<<1024, 256>>>((__nv_bfloat16 *)g.w, g.N * g.K, 2, 3.4f / sqrtf((float)g.K));
  } else {
    fill_fp8<<<1024, 256>>>((__nv_fp8_e4m3 *)g.x, g.M * g.K, 1), fill_fp8<<<1024, 256>>>((__nv_fp8_e4m3 *)g.w, g.N * g.K, 2);
  }
  fill_bf16<<<64, 256>>>((__nv_bfloat16 *)g.bias, g.N, 3, 1.f);
  fill_f32<<<64, 256>>>((float *)g.sx, (int64_t)ns, 4), fill_f32<<<64, 256>>>((float *)g.sw, (int64_t)ns, 5);
  CK(cudaDeviceSynchronize());
}
static void release(Gemm &g) {
  cudaFree(g.x), cudaFree(g.w), cudaFree(g.y), cudaFree(g.bias), cudaFree(g.sx), cudaFree(g.sw);
  cublasLtMatmulDescDestroy(g.d), cublasLtMatrixLayoutDestroy(g.a), cublasLtMatrixLayoutDestroy(g.b);
  cublasLtMatrixLayoutDestroy(g.dd);
}

// the outer vectors' orientation: y against a float64 host product with the scales as documented
static void check_outer() {
  Gemm g{512, 1024, 768, OUTER, 0, CUBLASLT_EPILOGUE_DEFAULT};
  alloc(g);
  if (!describe(g)) { printf("check: outer scale mode refused by the descriptor\n"); return; }
  const auto h = heuristic(g, 1, false);
  if (h.empty()) { printf("check: outer has no algorithm\n"); return; }
  CK(run_ms(g, h[0], 1) > 1e8f);
  std::vector<__nv_fp8_e4m3> x(g.M * g.K), w(g.N * g.K);
  std::vector<float> sx(g.M), sw(g.N);
  std::vector<__nv_bfloat16> y(g.M * g.N);
  CK(cudaMemcpy(x.data(), g.x, x.size(), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(w.data(), g.w, w.size(), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(sx.data(), g.sx, sx.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(sw.data(), g.sw, sw.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(y.data(), g.y, y.size() * 2, cudaMemcpyDeviceToHost));
  double num[2] = {0, 0}, den = 0; // [0]: sx by row of x, sw by channel; [1]: swapped
  for (int64_t m = 0; m < g.M; ++m)
    for (int64_t n = 0; n < g.N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < g.K; ++k) acc += (double)(float)x[m * g.K + k] * (double)(float)w[n * g.K + k];
      const double r0 = acc * sx[m] * sw[n], r1 = acc * sx[n % g.M] * sw[m % g.N], v = __bfloat162float(y[m * g.N + n]);
      num[0] += (v - r0) * (v - r0), num[1] += (v - r1) * (v - r1), den += r0 * r0;
    }
  printf("check outer (x per row, w per channel): rel. L2 %.2e; swapped %.2e\n", sqrt(num[0] / den), sqrt(num[1] / den));
  release(g);
}

int main() {
  lt_setup();
  check_outer();
  const int64_t shapes[6][3] = {{4608, 3072, 9216},  {4608, 3072, 12288},  {4608, 12288, 3072},
                                {32760, 5120, 5120}, {32760, 5120, 13824}, {32760, 13824, 5120}};
  struct V { Kind k; int fast; cublasLtEpilogue_t e; const char *name; };
  const V vs[] = {{BF16, 0, CUBLASLT_EPILOGUE_DEFAULT, "bf16"},
                  {TENSOR, 0, CUBLASLT_EPILOGUE_DEFAULT, "fp8 tensor"},
                  {TENSOR, 1, CUBLASLT_EPILOGUE_DEFAULT, "fp8 tensor fast"},
                  {OUTER, 0, CUBLASLT_EPILOGUE_DEFAULT, "fp8 outer"},
                  {OUTER, 1, CUBLASLT_EPILOGUE_DEFAULT, "fp8 outer fast"},
                  {OUTER, 0, CUBLASLT_EPILOGUE_BIAS, "fp8 outer bias"},
                  {OUTER, 0, CUBLASLT_EPILOGUE_GELU_BIAS, "fp8 outer gelu+bias"},
                  {BLK, 0, CUBLASLT_EPILOGUE_DEFAULT, "fp8 blk128"},
                  {BLK, 1, CUBLASLT_EPILOGUE_DEFAULT, "fp8 blk128 fast"}};
  const int nv = sizeof vs / sizeof vs[0];
  for (const auto &sh : shapes) {
    printf("\n## %lldx%lldx%lld (M x K x N)\n| scaling | algorithms | us | TFLOP/s | vs bf16 |\n|---|---:|---:|---:|---:|\n",
           (long long)sh[0], (long long)sh[1], (long long)sh[2]);
    std::vector<Gemm> g(nv);
    std::vector<cublasLtMatmulAlgo_t> win(nv);
    std::vector<int> ok(nv), count(nv);
    for (int v = 0; v < nv; ++v) {
      g[v] = Gemm{sh[0], sh[1], sh[2], vs[v].k, vs[v].fast, vs[v].e};
      alloc(g[v]);
      const bool desc = describe(g[v]);
      const auto h = desc ? heuristic(g[v], 8, false) : std::vector<cublasLtMatmulAlgo_t>{};
      count[v] = (int)h.size(), ok[v] = !h.empty();
      if (ok[v]) win[v] = pick(g[v], h);
      if (ok[v] && run_ms(g[v], win[v], 1) > 1e8f) ok[v] = 0;
      if (!ok[v]) release(g[v]);
    }
    std::vector<std::vector<float>> t(nv);
    for (int round = 0; round < 7; ++round)
      for (int q = 0; q < nv; ++q) {
        const int v = (q + round) % nv;
        if (ok[v]) run_ms(g[v], win[v], 1), t[v].push_back(run_ms(g[v], win[v], 8));
      }
    float base = 0.f;
    for (int v = 0; v < nv; ++v) {
      if (!ok[v]) { printf("| %s | %d | - | - | - |\n", vs[v].name, count[v]); continue; }
      std::sort(t[v].begin(), t[v].end());
      const float us = t[v][t[v].size() / 2] * 1000.f;
      if (v == 0) base = us;
      printf("| %s | %d | %.1f | %.0f | %.3f |\n", vs[v].name, count[v], us, 2e-6 * sh[0] * sh[1] * sh[2] / us, base / us);
      release(g[v]);
    }
  }
  return 0;
}
