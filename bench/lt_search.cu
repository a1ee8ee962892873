// How fast cuBLASLt can make y = act(x w^T + b) (bf16, float32 accumulation) by the choice of
// algorithm, with each epilogue against the plain GEMM: the evidence behind fusedk's
// FUSEDK_LINEAR_TUNE levels (fusedk.h, [linear]) and bench/NOTES.md session 16.
// For each shape and epilogue (none, BIAS, RELU_BIAS, GELU_BIAS, GELU_AUX_BIAS), four searches:
//   heur1  the heuristic's first algorithm                          (FUSEDK_LINEAR_TUNE=0)
//   heur8  the heuristic's first 8, timed                           (=1, fusedk's default)
//   wide   + the tiles of those and of the plain GEMM's heuristic,
//          in every custom option x cluster shape, timed            (=2)
//   all    every tile x custom option x cluster shape that
//          cublasLtMatmulAlgoCheck accepts, timed                   (seconds a plan)
// Timing of a search: each candidate once after a warm-up run, then the best 16 and of those the
// best 3 in three rotated rounds of 3 launches (fusedk's lt_tune: 2 launches). Then every pick
// again in 7 rotated rounds (the clock drifts by several % under this load), median: the table,
// with the rate kept against the plain GEMM of the same search and against the fastest plain
// GEMM of any search. "all" takes the algorithm id and stages of the heuristic's first answer,
// fusedk's level 3 those of every answer (on the H100 all the same: id 66, stages 35).
//   nvcc -O2 -arch=sm_90a -o lt_search bench/lt_search.cu -lcublasLt && ./lt_search
#include "lt_common.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

struct Gemm { // y[M, N] = x[M, K] w[N, K]^T: column-major y^T = w^T(op T) x^T, as fusedk calls it
  int64_t M, K, N;
  void *x, *w, *y, *aux, *bias;
  cublasLtMatmulDesc_t d;
  cublasLtMatrixLayout_t a, b, dd;
};

static void describe(Gemm &g, cublasLtEpilogue_t epi) {
  CK(cublasLtMatmulDescCreate(&g.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t T = CUBLAS_OP_T, N = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_TRANSA, &T, sizeof T));
  CK(cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_TRANSB, &N, sizeof N));
  CK(cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (epi != CUBLASLT_EPILOGUE_DEFAULT)
    CK(cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
  if (epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
    const int64_t ld = g.N;
    CK(cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux));
    CK(cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
  }
  CK(cublasLtMatrixLayoutCreate(&g.a, CUDA_R_16BF, g.K, g.N, g.K));
  CK(cublasLtMatrixLayoutCreate(&g.b, CUDA_R_16BF, g.K, g.M, g.K));
  CK(cublasLtMatrixLayoutCreate(&g.dd, CUDA_R_16BF, g.N, g.M, g.N));
}

static uint32_t config(const cublasLtMatmulAlgo_t &a, cublasLtMatmulAlgoConfigAttributes_t attr) {
  uint32_t v = 0; // every attribute read here fits (id int32, tile/stages/custom uint32, cluster uint16)
  size_t w = 0, n = attr == CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID ? 2 : 4;
  cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &v, n, &w);
  return v;
}

// algorithm id, tile and stages of `seed` in custom option o and cluster shape cl, if g accepts it
static bool variant(const Gemm &g, const cublasLtMatmulAlgo_t &seed, uint32_t tile, uint32_t o, uint16_t cl,
                    cublasLtMatmulAlgo_t *a) {
  const int32_t id = (int32_t)config(seed, CUBLASLT_ALGO_CONFIG_ID);
  const uint32_t stages = config(seed, CUBLASLT_ALGO_CONFIG_STAGES_ID);
  if (cublasLtMatmulAlgoInit(H, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, id, a))
    return false;
  if (cublasLtMatmulAlgoConfigSetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile) ||
      cublasLtMatmulAlgoConfigSetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages) ||
      cublasLtMatmulAlgoConfigSetAttribute(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &o, sizeof o) ||
      cublasLtMatmulAlgoConfigSetAttribute(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cl, sizeof cl))
    return false;
  cublasLtMatmulHeuristicResult_t r{};
  return !cublasLtMatmulAlgoCheck(H, g.d, g.a, g.b, g.dd, g.dd, a, &r) && r.workspaceSize <= WSB;
}

static const uint16_t kClusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1,
                                     CUBLASLT_CLUSTER_SHAPE_2x1x1, CUBLASLT_CLUSTER_SHAPE_1x2x1,
                                     CUBLASLT_CLUSTER_SHAPE_2x2x1};

// the seeds' tiles (with their algorithm id and stages) in every custom option x cluster shape
static void widen(const Gemm &g, const std::vector<cublasLtMatmulAlgo_t> &seeds, const std::vector<uint32_t> &tiles,
                  std::vector<cublasLtMatmulAlgo_t> *out) {
  for (const cublasLtMatmulAlgo_t &s : seeds) {
    int32_t options = 0;
    size_t w;
    cublasLtMatmulAlgoCapGetAttribute(&s, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &options, sizeof options, &w);
    for (uint32_t t : tiles.empty() ? std::vector<uint32_t>{config(s, CUBLASLT_ALGO_CONFIG_TILE_ID)} : tiles)
      for (uint32_t o = 0; o <= (uint32_t)std::min(options, 15); ++o)
        for (uint16_t cl : kClusters) {
          cublasLtMatmulAlgo_t a;
          if (!variant(g, s, t, o, cl, &a)) continue;
          bool seen = false;
          for (const cublasLtMatmulAlgo_t &b : *out) seen |= !memcmp(&a, &b, sizeof a);
          if (!seen) out->push_back(a);
        }
    if (!tiles.empty()) return; // all tiles: one seed (the algorithm id) is enough
  }
}

static float median_us(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2] * 1000.f;
}

__global__ void fill(__nv_bfloat16 *p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffff) / 65536.f - 0.5f) * scale);
  }
}

int main() {
  lt_setup();
  std::vector<uint32_t> tiles; // every tile id the header names
  for (uint32_t t = 1; t < CUBLASLT_MATMUL_TILE_END; ++t) tiles.push_back(t);
  const int64_t shapes[3][3] = {{8192, 4096, 4096}, {4096, 3072, 12288}, {8192, 1152, 4608}};
  const cublasLtEpilogue_t epis[5] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_RELU_BIAS,
                                      CUBLASLT_EPILOGUE_GELU_BIAS, CUBLASLT_EPILOGUE_GELU_AUX_BIAS};
  const char *en[5] = {"none", "bias", "bias+relu", "bias+gelu_tanh", "bias+gelu_tanh+aux"};
  const char *sn[4] = {"heur1", "heur8", "wide", "all"};
  for (const auto &sh : shapes) {
    Gemm g[5];
    g[0] = Gemm{sh[0], sh[1], sh[2]};
    CK(cudaMalloc(&g[0].x, g[0].M * g[0].K * 2));
    CK(cudaMalloc(&g[0].w, g[0].N * g[0].K * 2));
    CK(cudaMalloc(&g[0].y, g[0].M * g[0].N * 2));
    CK(cudaMalloc(&g[0].aux, g[0].M * g[0].N * 2));
    CK(cudaMalloc(&g[0].bias, g[0].N * 2));
    fill<<<1024, 256>>>((__nv_bfloat16 *)g[0].x, g[0].M * g[0].K, 1, 3.4f); // ~ unit variance
    fill<<<1024, 256>>>((__nv_bfloat16 *)g[0].w, g[0].N * g[0].K, 2, 3.4f / sqrtf((float)g[0].K));
    fill<<<1024, 256>>>((__nv_bfloat16 *)g[0].bias, g[0].N, 3, 1.f);
    CK(cudaDeviceSynchronize());
    printf("\n## %lldx%lldx%lld (M x K x N)\n", (long long)g[0].M, (long long)g[0].K, (long long)g[0].N);
    cublasLtMatmulAlgo_t win[5][4];
    describe(g[0], epis[0]);
    const std::vector<cublasLtMatmulAlgo_t> plain8 = heuristic(g[0], 8);
    for (int e = 0; e < 5; ++e) {
      if (e) g[e] = g[0], describe(g[e], epis[e]);
      const std::vector<cublasLtMatmulAlgo_t> h8 = heuristic(g[e], 8);
      if (h8.empty()) { printf("%s: the heuristic has no algorithm\n", en[e]); return 1; }
      std::vector<cublasLtMatmulAlgo_t> wide = h8, all = h8, seeds = h8;
      seeds.insert(seeds.end(), plain8.begin(), plain8.end());
      std::vector<uint32_t> none;
      for (const cublasLtMatmulAlgo_t &s : seeds) widen(g[e], {s}, none, &wide);
      auto t0 = std::chrono::steady_clock::now();
      widen(g[e], {h8[0]}, tiles, &all);
      win[e][0] = h8[0];
      for (int k = 1; k < 4; ++k) {
        const auto &c = k == 1 ? h8 : k == 2 ? wide : all;
        auto t1 = std::chrono::steady_clock::now();
        win[e][k] = pick(g[e], c);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - (k == 3 ? t0 : t1)).count();
        printf("%-20s %-5s %4zu candidates, %6.2f s, pick: tile %u custom %u cluster %u\n", en[e], sn[k], c.size(), s,
               config(win[e][k], CUBLASLT_ALGO_CONFIG_TILE_ID), config(win[e][k], CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
               config(win[e][k], CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
      }
    }
    std::vector<float> t[5][4];
    for (int round = 0; round < 7; ++round)
      for (int q = 0; q < 20; ++q) {
        const int j = (q + round * 3) % 20, e = j / 4, k = j % 4;
        run_ms(g[e], win[e][k], 1);
        t[e][k].push_back(run_ms(g[e], win[e][k], 8));
      }
    printf("\n| epilogue | heur1 us | heur8 us | wide us | all us |\n|---|---:|---:|---:|---:|\n");
    float plain[4], best = 1e30f;
    for (int k = 0; k < 4; ++k) best = std::min(best, plain[k] = median_us(t[0][k]));
    for (int e = 0; e < 5; ++e) {
      printf("| %s |", en[e]);
      for (int k = 0; k < 4; ++k) {
        const float us = median_us(t[e][k]);
        if (e) printf(" %.1f (%.3f, %.3f) |", us, plain[k] / us, best / us);
        else printf(" %.1f |", us);
      }
      printf("\n");
    }
    printf("(in brackets: the plain GEMM's rate kept, against the plain GEMM of the same search, and against the "
           "fastest plain GEMM of any search)\n");
    cudaFree(g[0].x), cudaFree(g[0].w), cudaFree(g[0].y), cudaFree(g[0].aux), cudaFree(g[0].bias);
  }
  return 0;
}
