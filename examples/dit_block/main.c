/* One Flux-style DiT block in plain C on fusedk alone: the same program runs on CPU tensors (the
   references) and on CUDA tensors (the kernels), in bf16.

     mod = linear(silu(temb), W_mod)             AdaLN-Zero: shift, scale, gate for each half
     qkv = linear(adaln(x, scale1, shift1), W_qkv)          one GEMM for q, k and v
     q, k, v = qk_norm_rope(qkv)                 per-head RMSNorm, Flux's 3-axis RoPE, [B, S, H, Dh]
     x1  = gated_residual(x, linear(attention(q, k, v), W_o), gate1)
     out = gated_residual(x1, linear(linear(adaln(x1, scale2, shift2), W_1, gelu_tanh), W_2), gate2)

   At a small size the GPU block is checked against the CPU one (and a CUDA-graph replay against
   the eager GPU call); at Flux-dev's size (B 1, 512 text + 4096 image tokens, D 3072, 24 heads of
   128, MLP 12288) the block is timed eager and as a CUDA graph.
   FP8 run (beside the bf16 one): the four projections on FP8 tensor cores (linear_fp8), their
   weights quantized once (e4m3, a scale an output channel); adaln_fp8 writes the q/k/v and MLP
   inputs in FP8 (a scale a row), attention's output and the MLP's hidden state go through
   quantize_fp8; the modulation reads its weight as int8 (linear_w8: one row of temb a sample, so
   the weight's bytes are its cost, and int8's step is a third of e4m3's error there). Checked on
   the CPU against the bf16 block and on the GPU against the CPU's FP8 block, and timed beside
   the bf16 block.
   Build: part of `meson compile -C build`; run: build/fusedk_dit_block (tools/demo.sh runs it;
   --check: the small checks only, as `meson test` runs it; --dump FILE: the CPU block's output
   as raw bf16 into FILE, nothing else: tests/python/test_dit_block.py checks it against NumPy). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedk.h"
#ifdef FUSEDK_DEMO_CUDA
#include <cuda_runtime.h>
#endif

typedef struct { int64_t B, St, gh, gw, D, H, F; } dims; /* S = St text + gh * gw image tokens */
typedef struct {                                         /* as nn.Linear keeps them: w [N, K], b [N] */
  void *mod_w, *mod_b, *qkv_w, *qkv_b, *q_norm, *k_norm, *o_w, *o_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
  void *w8[5], *s8[5]; /* FP8: qkv, o, fc1, fc2 as e4m3 [N, K], mod as int8, a float32 scale an output channel */
} weights;
typedef struct { void *t, *mod, *n, *qkv, *q, *k, *v, *o, *y, *x1, *h, *cos, *sin, *x8, *xs; } acts; /* x8, xs: FP8 inputs */
typedef struct { int gpu, fp8; struct CUstream_st *stream; } where;
typedef struct { fusedk_tensor t; int64_t shape[4], strides[4]; } view;

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})
#define CHECK(call)                                                               \
  do {                                                                            \
    fusedk_status st_ = (call);                                                   \
    if (st_) {                                                                    \
      fprintf(stderr, "dit_block: %s: %s\n", #call, fusedk_failure_reason());     \
      return st_;                                                                 \
    }                                                                             \
  } while (0)

static int64_t seq(const dims *d) { return d->St + d->gh * d->gw; }

/* v describes p (+ offset elements) on w's device; strides NULL: compact. */
static const fusedk_tensor *mk(view *v, const where *w, void *p, fusedk_scalar s, int nd, const int64_t *shape,
                               const int64_t *strides, int64_t offset) {
  memcpy(v->shape, shape, nd * sizeof *shape);
  v->t = w->gpu ? fusedk_tensor_cuda(p, s, nd, v->shape, 0) : fusedk_tensor_cpu(p, s, nd, v->shape);
  if (strides) memcpy(v->strides, strides, nd * sizeof *strides), v->t.strides = v->strides;
  v->t.byte_offset = (uint64_t)offset * (s == FUSEDK_F32 ? 4 : s == FUSEDK_E4M3 || s == FUSEDK_I8 ? 1 : 2);
  return &v->t;
}
#define BF(v, p, nd, ...) mk(v, w, p, FUSEDK_BF16, nd, DIMS(__VA_ARGS__), NULL, 0)

/* y [B, S, N] = act(x w^T + b) for projection i of p (N x K) with x [B, S, K]: linear, or in FP8
   (w->fp8) linear_fp8 on x quantized into a->x8 first unless x8 (its producer's FP8 output) is given */
static fusedk_status proj(const where *w, const weights *p, const acts *a, int i, const dims *d, view *y,
                          const fusedk_tensor *x, const fusedk_scaled_tensor *x8, int64_t N, int64_t K,
                          void *wt16, void *b, fusedk_activation act) {
  const int64_t B = d->B, S = seq(d);
  view wt, bias, q, qs, w8, ws;
  if (!w->fp8)
    return fusedk_linear(&y->t, NULL, x, BF(&wt, wt16, 2, N, K), BF(&bias, b, 1, N), act, 0, w->stream);
  const fusedk_scaled_tensor xq = {mk(&q, w, a->x8, FUSEDK_E4M3, 3, DIMS(B, S, K), NULL, 0),
                                   mk(&qs, w, a->xs, FUSEDK_F32, 2, DIMS(B, S), NULL, 0)};
  const fusedk_scaled_tensor wq = {mk(&w8, w, p->w8[i], FUSEDK_E4M3, 2, DIMS(N, K), NULL, 0),
                                   mk(&ws, w, p->s8[i], FUSEDK_F32, 1, DIMS(N), NULL, 0)};
  if (!x8) CHECK(fusedk_quantize_fp8(&xq, x, w->stream));
  return fusedk_linear_fp8(&y->t, NULL, x8 ? x8 : &xq, &wq, BF(&bias, b, 1, N), act, 1, w->stream);
}

/* adaln(x) into n, or in FP8 (w->fp8) into a->x8, a->xs: *x8 then describes it */
static fusedk_status normed(const where *w, const acts *a, const dims *d, view *n, const fusedk_tensor *x,
                            const fusedk_tensor *scale, const fusedk_tensor *shift, view *q, view *qs,
                            fusedk_scaled_tensor *x8) {
  const int64_t B = d->B, S = seq(d), D = d->D;
  if (!w->fp8) return fusedk_adaln(&n->t, x, scale, shift, FUSEDK_NORM_LAYER, NULL, NULL, 1e-6f, w->stream);
  x8->data = mk(q, w, a->x8, FUSEDK_E4M3, 3, DIMS(B, S, D), NULL, 0);
  x8->scale = mk(qs, w, a->xs, FUSEDK_F32, 2, DIMS(B, S), NULL, 0);
  return fusedk_adaln_fp8(x8, x, scale, shift, FUSEDK_NORM_LAYER, NULL, NULL, 1e-6f, w->stream);
}

/* x [B, S, D] -> out; every launch on w's stream, nothing allocated: CUDA-graph capturable. */
static fusedk_status block(const where *w, const dims *d, const weights *p, const acts *a, void *out, void *x,
                           void *temb) {
  const int64_t B = d->B, S = seq(d), D = d->D, H = d->H, Dh = D / H, F = d->F;
  view t, ta, mod, chunk[6], wt, bias, n, qkv, q[3], qo[3], cs[2], qn, kn, y, x1, h, o, xo, n8, n8s;
  fusedk_scaled_tensor x8;
  for (int i = 0; i < 6; ++i) /* shift1, scale1, gate1, shift2, scale2, gate2: [B, D] views into mod */
    mk(&chunk[i], w, a->mod, FUSEDK_BF16, 2, DIMS(B, D), DIMS(6 * D, 1), i * D);
  for (int i = 0; i < 3; ++i) { /* q, k, v: [B, S, H, Dh] views into the packed projection, and their outputs */
    mk(&q[i], w, a->qkv, FUSEDK_BF16, 4, DIMS(B, S, H, Dh), DIMS(S * 3 * D, 3 * D, Dh, 1), i * D);
    BF(&qo[i], i == 0 ? a->q : i == 1 ? a->k : a->v, 4, B, S, H, Dh);
  }
  mk(&cs[0], w, a->cos, FUSEDK_F32, 2, DIMS(S, Dh / 2), NULL, 0);
  mk(&cs[1], w, a->sin, FUSEDK_F32, 2, DIMS(S, Dh / 2), NULL, 0);
  struct CUstream_st *s = w->stream;

  CHECK(fusedk_act(BF(&ta, a->t, 2, B, D), BF(&t, temb, 2, B, D), FUSEDK_ACT_SILU, s));
  if (w->fp8) {
    view m8, ms;
    const fusedk_scaled_tensor wq = {mk(&m8, w, p->w8[4], FUSEDK_I8, 2, DIMS(6 * D, D), NULL, 0),
                                     mk(&ms, w, p->s8[4], FUSEDK_F32, 1, DIMS(6 * D), NULL, 0)};
    CHECK(fusedk_linear_w8(BF(&mod, a->mod, 2, B, 6 * D), NULL, &ta.t, &wq, BF(&bias, p->mod_b, 1, 6 * D),
                           FUSEDK_ACT_NONE, s));
  } else {
    CHECK(fusedk_linear(BF(&mod, a->mod, 2, B, 6 * D), NULL, &ta.t, BF(&wt, p->mod_w, 2, 6 * D, D),
                        BF(&bias, p->mod_b, 1, 6 * D), FUSEDK_ACT_NONE, 0, s));
  }
  BF(&n, a->n, 3, B, S, D);
  BF(&qkv, a->qkv, 3, B, S, 3 * D);
  CHECK(normed(w, a, d, &n, BF(&xo, x, 3, B, S, D), &chunk[1].t, &chunk[0].t, &n8, &n8s, &x8));
  CHECK(proj(w, p, a, 0, d, &qkv, &n.t, w->fp8 ? &x8 : NULL, 3 * D, D, p->qkv_w, p->qkv_b, FUSEDK_ACT_NONE));
  CHECK(fusedk_qk_norm_rope(&qo[0].t, &qo[1].t, &qo[2].t, &q[0].t, &q[1].t, &q[2].t, &cs[0].t, &cs[1].t,
                            BF(&qn, p->q_norm, 1, Dh), BF(&kn, p->k_norm, 1, Dh), 1e-6f, FUSEDK_QK_NORM_HEAD,
                            FUSEDK_ROPE_INTERLEAVED, FUSEDK_LAYOUT_BSHD, (int32_t)Dh, s));
  CHECK(fusedk_attention(BF(&o, a->o, 4, B, S, H, Dh), NULL, &qo[0].t, &qo[1].t, &qo[2].t, NULL, 0.0f, 0, s));
  BF(&y, a->y, 3, B, S, D);
  BF(&h, a->h, 3, B, S, F);
  CHECK(proj(w, p, a, 1, d, &y, BF(&o, a->o, 3, B, S, D), NULL, D, D, p->o_w, p->o_b, FUSEDK_ACT_NONE));
  CHECK(fusedk_gated_residual(BF(&x1, a->x1, 3, B, S, D), &xo.t, &y.t, &chunk[2].t, s));
  CHECK(normed(w, a, d, &n, &x1.t, &chunk[4].t, &chunk[3].t, &n8, &n8s, &x8));
  CHECK(proj(w, p, a, 2, d, &h, &n.t, w->fp8 ? &x8 : NULL, F, D, p->fc1_w, p->fc1_b, FUSEDK_ACT_GELU_TANH));
  CHECK(proj(w, p, a, 3, d, &y, &h.t, NULL, D, F, p->fc2_w, p->fc2_b, FUSEDK_ACT_NONE));
  CHECK(fusedk_gated_residual(BF(&o, out, 3, B, S, D), &x1.t, &y.t, &chunk[5].t, s));
  return FUSEDK_OK;
}

/* ---- host data: bf16 bits from a seeded generator ---- */
static float frand(uint32_t *s) { /* xorshift, uniform in [-1, 1) */
  *s ^= *s << 13, *s ^= *s >> 17, *s ^= *s << 5;
  return (float)(*s & 0xffffff) / 8388608.0f - 1.0f;
}
static uint16_t to_bf16(float f) { /* round to nearest even */
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t *host_rand(size_t n, float scale, float shift, uint32_t seed) {
  uint16_t *h = malloc(n * 2);
  for (size_t i = 0; h && i < n; ++i) h[i] = to_bf16(shift + scale * frand(&seed));
  return h;
}

/* Every buffer of one block's run, on the CPU or the GPU. */
typedef struct { weights p; acts a; void *x, *temb, *out; void *ptrs[48]; int n; } model;

static void *put(model *m, const where *w, const void *host, size_t bytes) {
  void *p = NULL;
#ifdef FUSEDK_DEMO_CUDA
  if (w->gpu) { /* copied in w's stream's order (a non-blocking stream: the legacy one's copies race it) */
    if (cudaMalloc(&p, bytes) != cudaSuccess) p = NULL;
    else if (host && cudaMemcpyAsync(p, host, bytes, cudaMemcpyHostToDevice, (cudaStream_t)w->stream) != cudaSuccess)
      cudaFree(p), p = NULL;
    return m->ptrs[m->n++] = p; /* NULL recorded: build() reports it */
  }
#endif
  (void)w;
  p = malloc(bytes);
  if (p && host) memcpy(p, host, bytes);
  return m->ptrs[m->n++] = p;
}
static void *put_rand(model *m, const where *w, size_t n, float scale, float shift, uint32_t seed) {
  uint16_t *h = host_rand(n, scale, shift, seed);
  void *p = h ? put(m, w, h, n * 2) : NULL;
  free(h);
  return p;
}
static void release(model *m, const where *w) {
  for (int i = 0; i < m->n; ++i) {
#ifdef FUSEDK_DEMO_CUDA
    if (w->gpu) {
      cudaFree(m->ptrs[i]);
      continue;
    }
#endif
    (void)w;
    free(m->ptrs[i]);
  }
  m->n = 0;
}

/* Weights and inputs from seeds (the same values on either device), activations, rope tables. */
static int build(model *m, const where *w, const dims *d) {
  const size_t B = d->B, S = seq(d), D = d->D, F = d->F, Dh = D / d->H;
  const float ws = 1.0f / sqrtf((float)D), ws2 = 1.0f / sqrtf((float)F);
  memset(m, 0, sizeof *m);
  weights *p = &m->p;
  p->mod_w = put_rand(m, w, 6 * D * D, ws, 0, 1), p->mod_b = put_rand(m, w, 6 * D, 0.1f, 0, 2);
  p->qkv_w = put_rand(m, w, 3 * D * D, ws, 0, 3), p->qkv_b = put_rand(m, w, 3 * D, 0.1f, 0, 4);
  p->q_norm = put_rand(m, w, Dh, 0.2f, 1, 5), p->k_norm = put_rand(m, w, Dh, 0.2f, 1, 6);
  p->o_w = put_rand(m, w, D * D, ws, 0, 7), p->o_b = put_rand(m, w, D, 0.1f, 0, 8);
  p->fc1_w = put_rand(m, w, F * D, ws, 0, 9), p->fc1_b = put_rand(m, w, F, 0.1f, 0, 10);
  p->fc2_w = put_rand(m, w, D * F, ws2, 0, 11), p->fc2_b = put_rand(m, w, D, 0.1f, 0, 12);
  m->x = put_rand(m, w, B * S * D, 1, 0, 13), m->temb = put_rand(m, w, B * D, 1, 0, 14);
  acts *a = &m->a;
  size_t sizes[] = {B * D, B * 6 * D, B * S * D, B * S * 3 * D, B * S * D, B * S * D, B * S * D, B * S * D,
                    B * S * D, B * S * D, B * S * F};
  void **slots[] = {&a->t, &a->mod, &a->n, &a->qkv, &a->q, &a->k, &a->v, &a->o, &a->y, &a->x1, &a->h};
  for (int i = 0; i < 11; ++i) *slots[i] = put(m, w, NULL, sizes[i] * 2);
  m->out = put(m, w, NULL, B * S * D * 2);
  if (w->fp8) { /* the projections' e4m3 (mod: int8) weights, quantized here once; the FP8 inputs' buffer */
    void *w16[5] = {p->qkv_w, p->o_w, p->fc1_w, p->fc2_w, p->mod_w};
    const int64_t nk[5][2] = {{3 * (int64_t)D, (int64_t)D}, {(int64_t)D, (int64_t)D}, {(int64_t)F, (int64_t)D},
                              {(int64_t)D, (int64_t)F}, {6 * (int64_t)D, (int64_t)D}};
    a->x8 = put(m, w, NULL, B * S * F), a->xs = put(m, w, NULL, B * S * 4);
    for (int i = 0; i < 5; ++i) {
      p->w8[i] = put(m, w, NULL, (size_t)(nk[i][0] * nk[i][1])), p->s8[i] = put(m, w, NULL, (size_t)nk[i][0] * 4);
      if (!w16[i] || !p->w8[i] || !p->s8[i]) return fprintf(stderr, "dit_block: out of memory\n"), 1;
      view v16, v8, vs;
      const fusedk_scaled_tensor q = {mk(&v8, w, p->w8[i], i < 4 ? FUSEDK_E4M3 : FUSEDK_I8, 2, nk[i], NULL, 0),
                                      mk(&vs, w, p->s8[i], FUSEDK_F32, 1, nk[i], NULL, 0)};
      const fusedk_tensor *x16 = mk(&v16, w, w16[i], FUSEDK_BF16, 2, nk[i], NULL, 0);
      CHECK(i < 4 ? fusedk_quantize_fp8(&q, x16, w->stream) : fusedk_quantize_int8(&q, x16, w->stream));
    }
  }
  a->cos = put(m, w, NULL, S * Dh / 2 * 4), a->sin = put(m, w, NULL, S * Dh / 2 * 4);
  for (int i = 0; i < m->n; ++i)
    if (!m->ptrs[i]) return fprintf(stderr, "dit_block: out of memory\n"), 1;
  /* Flux's position ids: text tokens (0, 0, 0), image tokens (0, row, column); axes Dh/8, rest halved */
  float *ids = calloc(S * 3, 4);
  for (size_t i = d->St; ids && i < S; ++i)
    ids[i * 3 + 1] = (float)((i - d->St) / d->gw), ids[i * 3 + 2] = (float)((i - d->St) % d->gw);
  const int32_t axes[3] = {(int32_t)Dh / 8, (int32_t)(Dh - Dh / 8) / 2, (int32_t)(Dh - Dh / 8) / 2};
  view vc, vs, vi;
  void *dids = ids ? put(m, w, ids, S * 3 * 4) : NULL;
  free(ids);
  if (!dids) return fprintf(stderr, "dit_block: out of memory\n"), 1;
  CHECK(fusedk_rope_table_axes(mk(&vc, w, a->cos, FUSEDK_F32, 2, DIMS((int64_t)S, (int64_t)Dh / 2), NULL, 0),
                               mk(&vs, w, a->sin, FUSEDK_F32, 2, DIMS((int64_t)S, (int64_t)Dh / 2), NULL, 0),
                               mk(&vi, w, dids, FUSEDK_F32, 2, DIMS((int64_t)S, 3), NULL, 0), axes, 3, 10000.0f,
                               w->stream));
  return 0;
}

static double flops(const dims *d) { /* GEMMs and attention, 2 a multiply-add */
  const double M = (double)d->B * seq(d), D = (double)d->D, F = (double)d->F;
  return 2.0 * d->B * 6 * D * D + 2 * M * (3 * D * D + D * D + 2 * F * D) + 4.0 * d->B * seq(d) * seq(d) * D;
}

#ifdef FUSEDK_DEMO_CUDA
/* ms a block, the mean over reps: eager calls, or replays of one captured graph */
static float time_block(const where *w, const dims *d, model *m, int graph, int reps) {
  cudaStream_t s = (cudaStream_t)w->stream;
  cudaGraph_t g = NULL;
  cudaGraphExec_t ge = NULL;
  cudaEvent_t e0, e1;
  float ms = -1;
  int bad = 0;
  if (graph) {
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    fusedk_status st = block(w, d, &m->p, &m->a, m->out, m->x, m->temb);
    bad = cudaStreamEndCapture(s, &g) != cudaSuccess || st || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess;
  }
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  for (int i = 0; i < reps + 2 && !bad; ++i) { /* two warm-ups */
    if (i == 2) cudaEventRecord(e0, s);
    bad = graph ? cudaGraphLaunch(ge, s) != cudaSuccess : block(w, d, &m->p, &m->a, m->out, m->x, m->temb) != 0;
  }
  cudaEventRecord(e1, s);
  if (cudaEventSynchronize(e1) != cudaSuccess || (!bad && cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)) bad = 1;
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  if (ge) cudaGraphExecDestroy(ge);
  if (g) cudaGraphDestroy(g);
  return bad ? -1 : ms / reps;
}

static int download(float *dst, const void *src, size_t n) {
  uint16_t *h = malloc(n * 2);
  int bad = !h || cudaMemcpy(h, src, n * 2, cudaMemcpyDeviceToHost) != cudaSuccess;
  for (size_t i = 0; !bad && i < n; ++i) dst[i] = from_bf16(h[i]);
  free(h);
  return bad;
}

/* The small block on the GPU (FP8: fp8) against the CPU's out (n floats): eager, then a graph replay. */
static int check_gpu(const dims *d, const float *want, size_t n, int fp8) {
  where w = {1, fp8, NULL};
  cudaStreamCreateWithFlags((cudaStream_t *)&w.stream, cudaStreamNonBlocking);
  model m;
  memset(&m, 0, sizeof m);
  float *got = malloc(n * 4), *again = malloc(n * 4);
  int bad = !got || !again || build(&m, &w, d) || block(&w, d, &m.p, &m.a, m.out, m.x, m.temb) ||
            cudaStreamSynchronize((cudaStream_t)w.stream) != cudaSuccess || download(got, m.out, n);
  double se = 0, sr = 0, mx = 0;
  for (size_t i = 0; !bad && i < n; ++i) {
    double e = (double)got[i] - want[i];
    se += e * e, sr += (double)want[i] * want[i], mx = fmax(mx, fabs(e));
  }
  const double rel = sqrt(se / (sr > 0 ? sr : 1));
  bad = bad || !(rel < (fp8 ? 3e-2 : 1e-2));
  printf("gpu  %s block: %s, |gpu - cpu| relative L2 %.2e, max %.3g (%s)\n", fp8 ? "FP8" : "bf16",
         bad ? "FAILED" : "ok", rel, mx, fp8 ? "a value an e4m3 step apart where the GPU's float32 lands across a tie; "
         "bound 3e-2" : "bf16 rounding; bound 1e-2");
  bad = bad || cudaMemsetAsync(m.out, 0xff, n * 2, (cudaStream_t)w.stream) != cudaSuccess || /* NaN: the replay writes all */
        time_block(&w, d, &m, 1, 1) < 0 || download(again, m.out, n) || memcmp(got, again, n * 4);
  printf("gpu  %s block as a CUDA graph: %s\n", fp8 ? "FP8" : "bf16",
         bad ? "FAILED (differs from the eager call)" : "the eager call's bits");
  release(&m, &w);
  free(got), free(again);
  cudaStreamDestroy((cudaStream_t)w.stream);
  return bad;
}

static int time_flux(void) {
  const dims d = {1, 512, 64, 64, 3072, 24, 12288};
  struct cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  printf("gpu  Flux-dev block, B 1, %lld tokens (512 text + 4096 image), D 3072, 24 heads of 128, MLP 12288, %s:\n",
         (long long)seq(&d), prop.name);
  for (int fp8 = 0; fp8 < 2; ++fp8) {
    where w = {1, fp8, NULL};
    cudaStreamCreateWithFlags((cudaStream_t *)&w.stream, cudaStreamNonBlocking);
    model m;
    if (build(&m, &w, &d)) return 1;
    float eager = time_block(&w, &d, &m, 0, 20), graph = time_block(&w, &d, &m, 1, 20);
    if (eager < 0 || graph < 0) return fprintf(stderr, "dit_block: the timed runs failed\n"), 1;
    printf("       %s: eager %.3f ms, CUDA graph %.3f ms a block (%.0f TFLOP/s)\n", fp8 ? "FP8 projections" : "bf16",
           eager, graph, flops(&d) / graph / 1e9);
    release(&m, &w);
    cudaStreamDestroy((cudaStream_t)w.stream);
  }
  return 0;
}
#endif

int main(int argc, char **argv) {
  const int timing = !(argc > 1 && !strcmp(argv[1], "--check"));
  const char *dump = argc > 2 && !strcmp(argv[1], "--dump") ? argv[2] : NULL; /* the CPU block's out, raw bf16 */
  const dims d = {2, 37, 9, 14, 256, 4, 1024}; /* S = 163: tails in every tile */
  const size_t n = (size_t)d.B * seq(&d) * d.D;
  where cpu = {0, 0, NULL}, cpu8 = {0, 1, NULL};
  model m;
  printf("fusedk %s dit_block: B %lld, S %lld, D %lld, %lld heads, MLP %lld, bf16\n", fusedk_version(),
         (long long)d.B, (long long)seq(&d), (long long)d.D, (long long)d.H, (long long)d.F);
  if (build(&m, &cpu, &d) || block(&cpu, &d, &m.p, &m.a, m.out, m.x, m.temb)) return 1;
  float *want = malloc(n * 4);
  double sum = 0;
  for (size_t i = 0; want && i < n; ++i) want[i] = from_bf16(((uint16_t *)m.out)[i]), sum += fabs(want[i]);
  if (!want || !(sum > 0 && sum < INFINITY)) return fprintf(stderr, "dit_block: the CPU block's output is off\n"), 1;
  printf("cpu  block: out[0..3] = %.4f %.4f %.4f, mean |out| %.4f\n", want[0], want[1], want[2], sum / n);
  if (dump) {
    FILE *f = fopen(dump, "wb");
    const int bad = !f || fwrite(m.out, 2, n, f) != n;
    if (f) fclose(f);
    release(&m, &cpu), free(want);
    return bad ? fprintf(stderr, "dit_block: cannot write %s\n", dump), 1 : 0;
  }
  release(&m, &cpu);
  /* the FP8 block on the CPU (the references, e4m3 products exact in double) against the bf16 one */
  float *want8 = malloc(n * 4);
  if (!want8 || build(&m, &cpu8, &d) || block(&cpu8, &d, &m.p, &m.a, m.out, m.x, m.temb)) return 1;
  double se = 0, sr = 0;
  for (size_t i = 0; i < n; ++i) {
    want8[i] = from_bf16(((uint16_t *)m.out)[i]);
    se += ((double)want8[i] - want[i]) * ((double)want8[i] - want[i]), sr += (double)want[i] * want[i];
  }
  release(&m, &cpu8);
  const double rel8 = sqrt(se / sr);
  printf("cpu  FP8 block: relative L2 against the bf16 block %.4f (%s; bound 0.1)\n", rel8,
         rel8 < 0.1 ? "ok" : "FAILED");
  int rc = !(rel8 < 0.1);
#ifdef FUSEDK_DEMO_CUDA
  if (fusedk_cuda_device_count() > 0) {
    rc = rc || check_gpu(&d, want, n, 0) || check_gpu(&d, want8, n, 1);
    rc = rc || (timing && time_flux());
  } else {
    printf("no GPU: the CPU block only\n");
  }
#else
  (void)timing;
  printf("built without the GPU half: the CPU block only\n");
#endif
  free(want), free(want8);
  fusedk_shutdown();
  return rc;
}
