// The launch plans of attention's portable kernel (fusedk_kernels.cu, [attention]: attn_kernel)
// side by side: the evidence behind AttnPlan. For each shape of bench/bench_attention.py (bf16)
// and each plan (warps, 16-row tiles a warp, keys a tile, blocks an SM, S fragments a step
// ahead), TFLOP/s of the median of 5 rotated rounds of 10 launches, and the largest difference
// to the first plan's output.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DFUSEDK_ONLY_ATTENTION -I. \
//        -o attn_plans bench/attn_plans.cu && ./attn_plans
#include "fusedk_kernels.cu"

#include <cstdarg>
#include <cstdio>

extern "C" fusedk_status fusedk__fail(fusedk_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return s;
}

#define CK(...)                                                                        \
  do {                                                                                 \
    cudaError_t e_ = (__VA_ARGS__);                                                    \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "%s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);    \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

using T = __nv_bfloat16;
struct Shape { int B, H, S, D, causal; };

template <int D, typename P> void one(const fusedk__attn_args &a, const Shape &sh, std::vector<float> &ms, int r,
                                      uint16_t *ref, size_t n, int first) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(launch_attn<T, D, P, true>(a, 0, 0));
  CK(cudaEventRecord(e0));
  for (int i = 0; i < 10; ++i) CK(launch_attn<T, D, P, true>(a, 0, 0));
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float t;
  CK(cudaEventElapsedTime(&t, e0, e1));
  ms.push_back(t / 10);
  if (r == 0) { // the output against the first plan's
    std::vector<uint16_t> h(n);
    CK(cudaMemcpy(h.data(), a.out.p, n * 2, cudaMemcpyDeviceToHost));
    if (first) memcpy(ref, h.data(), n * 2);
    float worst = 0;
    for (size_t i = 0; i < n; ++i) {
      uint32_t x = (uint32_t)h[i] << 16, y = (uint32_t)ref[i] << 16;
      float fx, fy;
      memcpy(&fx, &x, 4), memcpy(&fy, &y, 4);
      worst = fmaxf(worst, fabsf(fx - fy));
    }
    if (worst > 0.02f) printf("  plan <%d,%d,%d,%d>: max |diff| to the first plan %g\n", P::kWarps, P::kMt, P::kBc,
                              P::kMinBlocks, worst);
  }
  (void)sh;
  cudaEventDestroy(e0), cudaEventDestroy(e1);
}

template <int D, typename... Ps> void plans(const Shape &sh) {
  const int64_t n = (int64_t)sh.B * sh.S * sh.H * sh.D;
  T *q, *k, *v, *o;
  for (T **p : {&q, &k, &v, &o}) CK(cudaMalloc(p, n * 2));
  std::vector<uint16_t> h(n);
  uint64_t x = 88172645463325252ull;
  for (auto *p : {q, k, v}) {
    for (int64_t i = 0; i < n; ++i) { // roughly N(0, 1): a sum of 4 uniforms, centred
      float f = 0;
      for (int j = 0; j < 4; ++j) x ^= x << 13, x ^= x >> 7, x ^= x << 17, f += (float)(x >> 40) / (1 << 24);
      const float g = (f - 2.f) * 1.7f;
      uint32_t u;
      memcpy(&u, &g, 4);
      h[i] = (uint16_t)((u + 0x8000u) >> 16);
    }
    CK(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice));
  }
  fusedk__attn_args a;
  memset(&a, 0, sizeof a);
  a.scalar = FUSEDK_BF16, a.causal = sh.causal, a.scale = 1.f / sqrtf((float)sh.D);
  a.B = sh.B, a.Sq = a.Sk = sh.S, a.Hq = a.Hkv = sh.H, a.Dh = sh.D;
  const int64_t sb = (int64_t)sh.S * sh.H * sh.D, ss = (int64_t)sh.H * sh.D, shd = sh.D;
  a.q = {q, sb, ss, shd}, a.k = {k, sb, ss, shd}, a.v = {v, sb, ss, shd}, a.out = {o, sb, ss, shd};
  constexpr int np = sizeof...(Ps);
  std::vector<float> ms[np];
  std::vector<uint16_t> ref(n);
  for (int r = 0; r < 5; ++r) { // rounds, the order rotated
    int i = 0;
    auto run = [&](auto tag, int idx) {
      using P = typename decltype(tag)::type;
      if ((idx + np - r % np) % np == i) one<D, P>(a, sh, ms[idx], r, ref.data(), n, idx == 0);
    };
    for (i = 0; i < np; ++i) {
      int idx = 0;
      (run(type_tag<Ps>{}, idx++), ...);
    }
  }
  const double flop = 4.0 * sh.B * sh.H * (double)sh.S * sh.S * sh.D / (sh.causal ? 2 : 1);
  printf("B%d H%d S%d Dh%d%s\n", sh.B, sh.H, sh.S, sh.D, sh.causal ? " causal" : "");
  int idx = 0;
  auto show = [&](auto tag) {
    using P = typename decltype(tag)::type;
    std::vector<float> &m = ms[idx++];
    std::sort(m.begin(), m.end());
    printf("  <warps %d, mt %d, bc %3d, blocks %d, prefetch %d>  %7.1f us  %6.1f TFLOP/s\n", P::kWarps, P::kMt,
           P::kBc, P::kMinBlocks, (int)P::kPf, m[m.size() / 2] * 1e3, flop / (m[m.size() / 2] * 1e-3) / 1e12);
  };
  (show(type_tag<Ps>{}), ...);
  cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o);
}

int main() {
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  printf("%s\n", p.name);
  for (Shape s : {Shape{1, 24, 4608, 128, 0}, Shape{2, 24, 4096, 128, 1}, Shape{1, 24, 16384, 128, 0}})
    plans<128, AttnShape<8, 1, 64, 1>, AttnShape<4, 2, 64, 1>, AttnShape<4, 2, 64, 2>, AttnShape<4, 2, 32, 2>,
          AttnShape<4, 1, 64, 2>, AttnShape<8, 2, 32, 1>, AttnShape<8, 1, 32, 2>, AttnShape<8, 1, 128, 1>,
          AttnShape<4, 1, 128, 2>, AttnShape<4, 2, 64, 2, true>>(s);
  plans<64, AttnShape<8, 1, 64, 2>, AttnShape<4, 2, 64, 2>, AttnShape<4, 2, 128, 2>, AttnShape<8, 1, 128, 1>,
        AttnShape<4, 1, 128, 3>, AttnShape<8, 2, 64, 1>, AttnShape<4, 2, 64, 2, true>>(Shape{2, 16, 4096, 64, 0});
  plans<256, AttnShape<8, 1, 32, 1>, AttnShape<4, 1, 64, 1>, AttnShape<4, 1, 32, 2>, AttnShape<8, 1, 64, 1>,
        AttnShape<4, 2, 32, 1>>(Shape{1, 16, 8192, 256, 0});
  return 0;
}
