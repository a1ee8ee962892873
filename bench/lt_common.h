// What bench/lt_search.cu and bench/fp8_gemm_probe.cu share: the handle, fusedk's workspace and a
// stream; the heuristic's answers for a GEMM G (its desc d, layouts a (A), b (B), dd (C = D)), a
// timing of back-to-back launches of G (w as A, x as B, y as D) and the pick of the fastest
// candidate. G is each tool's own struct.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                                          \
  do {                                                                                                                 \
    const int e_ = (int)(x);                                                                                           \
    if (e_) { printf("error %d at line %d\n", e_, __LINE__); exit(1); }                                                \
  } while (0)

static cublasLtHandle_t H;
static void *WS;
static const size_t WSB = 32u << 20; // fusedk's workspace
static cudaStream_t S;

// the heuristic's first n answers; red: fusedk's reduction schemes only (split-K sums in float32)
template <class G> std::vector<cublasLtMatmulAlgo_t> heuristic(const G &g, int n, bool red = true) {
  cublasLtMatmulPreference_t pref;
  CK(cublasLtMatmulPreferenceCreate(&pref));
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WSB, sizeof WSB));
  const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE; // as fusedk
  if (red) CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask));
  std::vector<cublasLtMatmulHeuristicResult_t> r(n);
  int got = 0;
  cublasLtMatmulAlgoGetHeuristic(H, g.d, g.a, g.b, g.dd, g.dd, pref, n, r.data(), &got);
  cublasLtMatmulPreferenceDestroy(pref);
  std::vector<cublasLtMatmulAlgo_t> out;
  for (int i = 0; i < got; ++i)
    if (r[i].state == CUBLAS_STATUS_SUCCESS) out.push_back(r[i].algo);
  return out;
}

// ms a GEMM over `runs` back-to-back launches (1e9: it failed)
template <class G> float run_ms(const G &g, const cublasLtMatmulAlgo_t &a, int runs) {
  const float one = 1.f, zero = 0.f;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  cudaEventRecord(e0, S);
  bool ok = true;
  for (int i = 0; i < runs && ok; ++i)
    ok = !cublasLtMatmul(H, g.d, &one, g.w, g.a, g.x, g.b, &zero, g.y, g.dd, g.y, g.dd, &a, WS, WSB, S);
  cudaEventRecord(e1, S);
  float ms = 0.f;
  if (cudaEventSynchronize(e1) || cudaEventElapsedTime(&ms, e0, e1)) ok = false, cudaGetLastError();
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  return ok ? ms / runs : 1e9f;
}

template <class G> cublasLtMatmulAlgo_t pick(const G &g, const std::vector<cublasLtMatmulAlgo_t> &c) {
  std::vector<std::pair<float, size_t>> r;
  for (size_t i = 0; i < c.size(); ++i) {
    run_ms(g, c[i], 1); // loads the kernel's module (lazy loading)
    r.push_back({run_ms(g, c[i], 1), i});
  }
  for (size_t keep : {(size_t)16, (size_t)3}) {
    std::sort(r.begin(), r.end());
    r.resize(std::min(keep, r.size()));
    for (auto &x : r) x.first = 0.f;
    for (size_t round = 0; round < 3 && r.size() > 1; ++round)
      for (size_t j = 0; j < r.size(); ++j) {
        auto &x = r[(j + round) % r.size()];
        x.first += run_ms(g, c[x.second], 3);
      }
  }
  std::sort(r.begin(), r.end());
  return c[r[0].second];
}


// the handle, workspace and stream, and the device's name and cuBLASLt's version printed
inline void lt_setup() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  CK(cublasLtCreate(&H));
  CK(cudaMalloc(&WS, WSB));
  CK(cudaStreamCreate(&S));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s, cuBLASLt %zu\n", prop.name, cublasLtGetVersion());
}
