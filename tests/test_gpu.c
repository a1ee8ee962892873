/* GPU kernels against their CPU references (the header's implementation), on fresh random data:
   every op, every dtype, awkward D (1 ... 262144: the sub-warp, block, register-cached and
   re-reading kernel shapes), 1 to millions of rows, strided and broadcast inputs, misaligned
   (scalar path) inputs, in place, CUDA-graph capture, run-to-run determinism, and a tensor of
   more than 2^31 elements. Outputs are poisoned with NaN before each run, so an element the
   kernel skipped fails; padding between strided rows must stay untouched.

   Tolerance (documented in README): |gpu - cpu| <= eps_T * (|cpu| + aux) + 1e-5, i.e. one unit
   in the last place of the output (eps_T = 2^-7 bf16, 2^-10 f16, 1e-5 f32) over float32 math
   differences; aux = |x| for the Mochi op (float32 math on x + n), and |x| + |cpu| >= |n| in its
   exact mode, which rounds the normalized term n = y - x too: one ulp of n can show on top. Exit 77 (skip) without a CUDA device.

   Layout: helpers, then per family a case struct (case_t, rope_t, qknr_t, linear_t, attn_t: designated
   initializers, zero fields left out) and its runner (run_case, run_rope, run_qknr, run_linear),
   then the units (a family's cases for one dtype or one group, rows of cases below each) and
   the table of units, run as parallel processes (see "units and how they run"). */
#define _POSIX_C_SOURCE 200809L /* setenv, posix_spawn, strtok_r, clock_gettime */
#include <cuda_runtime.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fusedk.h"

extern char **environ;

static int failures = 0, checks = 0;
/* FUSEDK_TEST_SMALL=1 (tools/gpu_run.sh --sanitize): small cases of every op and path (tails,
   strided, misaligned, in place, every table layout), none of the large ones, so the suite runs
   under compute-sanitizer's 10-100x slowdown */
static int small;
#define CK(call)                                                                        \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);   \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

/* --- host values ------------------------------------------------------------------------- */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) { /* uniform [0, 1) */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}
static double nrand(void) { return sqrt(-2.0 * log(urand() + 1e-300)) * cos(6.283185307179586 * urand()); }

static size_t esize(fusedk_scalar s) { return s == FUSEDK_F32 ? 4 : s == FUSEDK_I8 || s == FUSEDK_E4M3 ? 1 : 2; }
static double eps_of(fusedk_scalar s) { return s == FUSEDK_F32 ? 1e-5 : s == FUSEDK_F16 ? 0x1p-10 : 0x1p-7; }
static const char *sname(fusedk_scalar s) { return s == FUSEDK_F32 ? "f32" : s == FUSEDK_F16 ? "f16" : "bf16"; }

/* float -> storage and back through the library's own CPU path would be circular; these are
   plain conversions used only to make inputs (any finite value is a valid input) */
static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static float f16_to_f32(uint16_t h) {
  uint32_t e = (h >> 10) & 31u, m = h & 1023u;
  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024u), (int)e - 25);
  return (h & 0x8000u) ? -v : v;
}
static uint16_t f32_to_f16(float f) { /* inputs here are |f| < 60000 and not tiny: normal path */
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a < 0x38800000u) return (uint16_t)sign; /* flush the few tiny inputs to zero */
  a += 0xfffu + ((a >> 13) & 1u);
  return (uint16_t)(sign | ((a >> 13) - (112u << 10)));
}
static double e4m3_to_f64(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double v = (b & 0x7f) == 0x7f ? NAN : e ? ldexp(8 + m, e - 10) : ldexp(m, -9);
  return b & 0x80 ? -v : v;
}
static uint8_t e4m3_exact(double v) { /* v an e4m3 value (|data| for the bound): its bits */
  const uint8_t sign = v < 0 ? 0x80 : 0;
  int e;
  v = fabs(v);
  if (v < 0x1p-6) return (uint8_t)(sign | (int)(v * 512.0));
  const double f = frexp(v, &e);
  return (uint8_t)(sign | (e + 6) << 3 | ((int)(f * 16.0) - 8));
}
static void put(void *p, size_t i, double v, fusedk_scalar s) { /* int8: rounded, clamped to +-127 */
  if (s == FUSEDK_F32) ((float *)p)[i] = (float)v;
  else if (s == FUSEDK_E4M3) ((uint8_t *)p)[i] = e4m3_exact(v);
  else if (s == FUSEDK_I8) ((int8_t *)p)[i] = (int8_t)(v > 127.0 ? 127 : v < -127.0 ? -127 : lrint(v));
  else if (s == FUSEDK_F16) ((uint16_t *)p)[i] = f32_to_f16((float)v);
  else ((uint16_t *)p)[i] = f32_to_bf16((float)v);
}
static double get(const void *p, size_t i, fusedk_scalar s) {
  if (s == FUSEDK_F32) return ((const float *)p)[i];
  if (s == FUSEDK_E4M3) return e4m3_to_f64(((const uint8_t *)p)[i]);
  if (s == FUSEDK_I8) return ((const int8_t *)p)[i];
  uint16_t h = ((const uint16_t *)p)[i];
  return s == FUSEDK_F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

/* --- a tensor with host and device copies of the same allocation ------------------------- */
typedef struct {
  int ndim;
  int64_t *shape, *strides; /* heap: the tensors point at them and buf_t is copied around */
  size_t off, n_alloc; /* element offset of element 0, elements allocated */
  fusedk_scalar s;
  void *h, *d;
  fusedk_tensor th, td;
} buf_t;

/* shape with row padding `pad` elements after each last-dim row and `shift` leading elements
   (misaligns the base when not a multiple of the vector); stride0 = 1 makes dim 0 broadcast */
static buf_t mk(fusedk_scalar s, int ndim, const int64_t *shape, int64_t pad, size_t shift, int stride0,
                double scale, double mean) {
  buf_t b;
  memset(&b, 0, sizeof b);
  b.ndim = ndim;
  b.s = s;
  b.shape = calloc(5, sizeof(int64_t)); /* up to 5 dims: conv's [N, T, H, W, C] */
  b.strides = calloc(5, sizeof(int64_t));
  int64_t st = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    b.shape[i] = shape[i];
    b.strides[i] = st;
    st *= i == ndim - 1 ? shape[i] + pad : shape[i];
  }
  if (stride0) {
    b.strides[0] = 0;
    st = ndim > 1 ? b.strides[0 + 1] * shape[1] : 1;
    if (ndim == 1) st = shape[0];
  }
  b.off = shift;
  b.n_alloc = (size_t)st + shift;
  b.h = malloc(b.n_alloc * esize(s));
  if (scale == 0.0) memset(b.h, 0, b.n_alloc * esize(s)); /* an output: poisoned next */
  for (size_t i = 0; scale != 0.0 && i < b.n_alloc; ++i) put(b.h, i, mean + scale * nrand(), s);
  CK(cudaMalloc(&b.d, b.n_alloc * esize(s)));
  CK(cudaMemcpy(b.d, b.h, b.n_alloc * esize(s), cudaMemcpyHostToDevice));
  CK(cudaDeviceSynchronize()); /* see poison */
  b.th = fusedk_tensor_cpu(b.h, s, ndim, b.shape);
  b.th.strides = b.strides;
  b.th.byte_offset = shift * esize(s);
  b.td = b.th;
  b.td.data = b.d;
  b.td.device.device_type = FUSEDK_DEVICE_CUDA;
  return b;
}
/* all-ones bytes: NaN in every dtype. Synchronized: the legacy-stream memset (and mk's copy)
   must land before a kernel on a non-blocking stream (the graph tests) writes the buffer, however
   busy the device is with other processes. */
static void poison(buf_t *b) {
  memset(b->h, 0xff, b->n_alloc * esize(b->s));
  CK(cudaMemset(b->d, 0xff, b->n_alloc * esize(b->s)));
  CK(cudaDeviceSynchronize());
}
static void drop(buf_t *b) {
  if (b->h) {
    free(b->h);
    free(b->shape);
    free(b->strides);
    CK(cudaFree(b->d));
  }
  memset(b, 0, sizeof *b);
}

/* --- [norm] ops ---------------------------------------------------------------------------- */
typedef enum { RMS, LN, ADALN_LN, ADALN_RMS, MOCHI, MOCHI_EXACT, GELU, GELU_TANH, SILU, RELU, SILU_FMA, GATED_RES,
               SWIGLU, GEGLU, GLU_PAIR, STEP_EULER, STEP_DDIM } op_t;
static const char *op_name[] = {"rmsnorm", "layernorm", "adaln(layer)", "adaln(rms)", "mochi", "mochi(exact)",
                                "act(gelu)", "act(gelu_tanh)", "act(silu)", "act(relu)", "silu_fma",
                                "gated_residual", "glu(silu, first)", "glu(gelu, second)", "glu_pair(gelu_tanh)",
                                "diffusion_step(euler, cfg)", "diffusion_step(ddim, cfg, clamp, blend)"};
enum { Y, RO, X, RES, W, BIAS, SCALE, SHIFT, GATE, C3, C4, NT };

static fusedk_status call(op_t op, buf_t *t, int dev, cudaStream_t stream) {
  const fusedk_tensor *p[NT];
  for (int i = 0; i < NT; ++i) p[i] = t[i].h ? (dev ? &t[i].td : &t[i].th) : NULL;
  struct CUstream_st *s = dev ? (struct CUstream_st *)stream : NULL;
  switch (op) {
    case RMS: return fusedk_rmsnorm(p[Y], p[RO], p[X], p[RES], p[W], 1e-6f, s);
    case LN: return fusedk_layernorm(p[Y], p[X], p[W], p[BIAS], 1e-5f, s);
    case ADALN_LN: return fusedk_adaln(p[Y], p[X], p[SCALE], p[SHIFT], FUSEDK_NORM_LAYER, p[W], p[BIAS], 1e-6f, s);
    case ADALN_RMS: return fusedk_adaln(p[Y], p[X], p[SCALE], p[SHIFT], FUSEDK_NORM_RMS, p[W], NULL, 1e-6f, s);
    case MOCHI: return fusedk_residual_tanh_gated_rmsnorm(p[Y], p[X], p[RES], p[GATE], 1e-6f, 0, s);
    case MOCHI_EXACT: return fusedk_residual_tanh_gated_rmsnorm(p[Y], p[X], p[RES], p[GATE], 1e-6f, 1, s);
    /* [elementwise] */
    case GELU: return fusedk_act(p[Y], p[X], FUSEDK_ACT_GELU, s);
    case GELU_TANH: return fusedk_act(p[Y], p[X], FUSEDK_ACT_GELU_TANH, s);
    case SILU: return fusedk_act(p[Y], p[X], FUSEDK_ACT_SILU, s);
    case RELU: return fusedk_act(p[Y], p[X], FUSEDK_ACT_RELU, s);
    case SILU_FMA: return fusedk_silu_fma(p[Y], p[X], p[RES], p[C3], s);
    case GATED_RES: return fusedk_gated_residual(p[Y], p[X], p[RES], p[GATE], s);
    case SWIGLU: return fusedk_glu(p[Y], p[X], FUSEDK_ACT_SILU, FUSEDK_GLU_FIRST, s);
    case GEGLU: return fusedk_glu(p[Y], p[X], FUSEDK_ACT_GELU, FUSEDK_GLU_SECOND, s);
    case GLU_PAIR: return fusedk_glu_pair(p[Y], p[X], p[RES], FUSEDK_ACT_GELU_TANH, s);
    /* [sampler]: x = X, cond = RES, uncond = C3, prev = C4 */
    case STEP_EULER: {
      const fusedk_step st = {FUSEDK_SAMPLER_EULER, 4.5f, 0.8f, 0.55f, 1.f, 1.f, 0.f, 1.f};
      return fusedk_diffusion_step(p[Y], p[X], p[RES], p[C3], NULL, &st, s);
    }
    case STEP_DDIM: {
      const fusedk_step st = {FUSEDK_SAMPLER_DDIM, 3.f, 0.f, 0.f, 0.45f, 0.6f, 1.5f, 0.8f};
      return fusedk_diffusion_step(p[Y], p[X], p[RES], p[C3], p[C4], &st, s);
    }
  }
  return FUSEDK_OK;
}

/* a host copy of b's device allocation (caller frees) */
static void *to_host(const buf_t *b) {
  void *h = malloc(b->n_alloc * esize(b->s));
  CK(cudaMemcpy(h, b->d, b->n_alloc * esize(b->s), cudaMemcpyDeviceToHost));
  return h;
}
/* element i (row-major over the logical shape) of b's host copy, and its offset */
static size_t view_at(const buf_t *b, int64_t i) {
  size_t off = b->off;
  for (int d = b->ndim - 1; d >= 0; --d) off += (size_t)((i % b->shape[d]) * b->strides[d]), i /= b->shape[d];
  return off;
}
static int64_t view_count(const buf_t *b) {
  int64_t n = 1;
  for (int d = 0; d < b->ndim; ++d) n *= b->shape[d];
  return n;
}
/* 1 for each element of o's allocation inside its view (caller frees) */
static unsigned char *view_mask(const buf_t *o) {
  unsigned char *m = calloc(o->n_alloc, 1);
  const int64_t n = view_count(o);
  for (int64_t i = 0; i < n; ++i) m[view_at(o, i)] = 1;
  return m;
}
/* elements outside o's view (padding, a shifted base) where the GPU's copy g differs from the
   host's h: the first few printed after `lead`, all counted */
static int outside_written(const char *lead, const char *what, const buf_t *o, const unsigned char *inview,
                           const void *g, const void *h) {
  int bad = 0;
  for (size_t i = 0; i < o->n_alloc; ++i)
    if (!inview[i] && memcmp((const char *)g + i * esize(o->s), (const char *)h + i * esize(o->s), esize(o->s)) &&
        bad++ < 3)
      printf("%s%s: element %zu outside the view was written\n", lead, what, i);
  return bad;
}

/* Compares an output's device copy with its host (CPU reference) copy element by element over
   the whole allocation: inside the view within tolerance, outside it still poisoned. finite: the
   inputs hold no NaN or Inf, so a NaN inside the view is an element neither side wrote (two
   untouched poisoned elements would otherwise compare equal); else a non-finite element matches
   any non-finite reference (below). */
static int compare(const char *what, buf_t *o, const buf_t *aux, int aux_ref, double eps, int finite) {
  void *g = to_host(o);
  unsigned char *inview = view_mask(o);
  int bad = outside_written("  ", what, o, inview, g, o->h);
  double worst = 0;
  for (size_t i = 0; i < o->n_alloc; ++i) {
    double a = get(g, i, o->s), b = get(o->h, i, o->s);
    if (!inview[i]) continue;
    double x = (aux ? fabs(get(aux->h, i, aux->s)) : 0.0) + (aux_ref ? fabs(b) : 0.0); /* aux: o's layout */
    double tol = eps * (fabs(b) + x) + 1e-5;
    if (finite && isnan(b)) {
      if (bad++ < 3) printf("  %s: element %zu of the view is NaN in the CPU reference: not written\n", what, i);
      continue;
    }
    /* !finite (the NaN/Inf rows): an Inf input's row is non-finite, NaN or +-Inf alike. The
       kernels compute in float32, the reference in float64: Inf * gelu(-8) is NaN in float32
       (gelu(-8) rounds to -0) and -Inf in float64 */
    int ok = (isnan(a) && isnan(b)) || a == b || fabs(a - b) <= tol || (!finite && !isfinite(a) && !isfinite(b));
    if (!ok && bad++ < 3) printf("  %s: element %zu gpu %.9g cpu %.9g (tol %.3g)\n", what, i, a, b, tol);
    if (ok && !isnan(a)) worst = fmax(worst, fabs(a - b) / (eps * (fabs(b) + x) + 1e-5));
  }
  free(g);
  free(inview);
  return bad;
}

/* A failed call or launch: printed, 1; else 0. */
static int call_failed(const char *what, fusedk_status sc, fusedk_status sg) {
  cudaError_t ce = cudaDeviceSynchronize();
  if (!sc && !sg && !ce) return 0;
  printf("FAIL %s: cpu %s gpu %s cuda %s: %s\n", what, fusedk_status_name(sc), fusedk_status_name(sg),
         cudaGetErrorString(ce), fusedk_failure_reason());
  return 1;
}
/* call_failed, counted as a failed check (for callers that skip their comparisons then) */
static int call_failed_counted(const char *what, fusedk_status sc, fusedk_status sg) {
  if (!call_failed(what, sc, sg)) return 0;
  ++checks, ++failures;
  return 1;
}

typedef struct {
  op_t op;
  fusedk_scalar s;
  int64_t B, L, D;     /* rows are [B, L] (rmsnorm/layernorm: B*L rows of a 2-d or 3-d x) */
  int weight, bias, residual;
  int64_t pad;         /* row padding of x, residual, y (strided rows) */
  size_t shift;        /* leading elements: misaligned base, scalar path */
  int vec_stride;      /* per-sample vectors as views into a [B, 6D] modulation tensor */
  int vec_broadcast;   /* per-sample vectors with stride 0 over B */
  int inplace;         /* y aliases x */
  int special;         /* 1: a NaN in row 0 and an Inf in row 1 of x; 2: rows 0, 1 (mod 3) offset by
                          +40 / -25 (LayerNorm's second pass; rows 2 (mod 3) stay near zero); 3:
                          rows of 1000 + 0.01 N(0, 1), element 0 at 999.75 / 1000.3 (f32) */
  int mod32;           /* scale, shift, gate in float32 beside f16/bf16 rows (Wan's modulation) */
} case_t;

static void run_case(const case_t *c) {
  buf_t t[NT];
  memset(t, 0, sizeof t);
  int64_t sh3[3] = {c->B, c->L, c->D}, vsh[2] = {c->B, c->D}, wsh[1] = {c->D};
  int is_mochi = c->op == MOCHI || c->op == MOCHI_EXACT, is_ew = c->op >= GELU;
  int64_t shx[3] = {c->B, c->L, (c->op == SWIGLU || c->op == GEGLU) ? 2 * c->D : c->D}; /* glu: x[..., 2H] */
  t[X] = c->special == 3 ? mk(c->s, 3, shx, c->pad, c->shift, 0, 0.01, 1000.0)
                         : mk(c->s, 3, shx, c->pad, c->shift, 0, is_ew ? 3.0 : 1.0, c->op == LN ? 0.5 : 0.0);
  const int is_step = c->op == STEP_EULER || c->op == STEP_DDIM;
  if (c->residual || is_mochi || c->op == SILU_FMA || c->op == GATED_RES || c->op == GLU_PAIR || is_step)
    t[RES] = mk(c->s, 3, sh3, c->pad, c->shift, 0, is_mochi ? 2.0 : 1.0, 0.0);
  if (c->op == SILU_FMA || is_step) t[C3] = mk(c->s, 3, sh3, c->pad, c->shift, 0, 1.0, 0.0);
  if (c->op == STEP_DDIM) /* prev: broadcast over B in the broadcast cases */
    t[C4] = mk(c->s, 3, sh3, c->pad, c->shift, c->vec_broadcast, 1.0, 0.0);
  if (c->inplace) {
    t[Y] = t[X];
  } else {
    t[Y] = mk(c->s, 3, sh3, c->pad, c->shift, 0, 0.0, 0.0);
    poison(&t[Y]);
  }
  if (c->residual && c->op == RMS) {
    t[RO] = mk(c->s, 3, sh3, c->pad, c->shift, 0, 0.0, 0.0);
    poison(&t[RO]);
  }
  if (c->weight) t[W] = mk(c->s, 1, wsh, 0, 0, 0, 0.2, 1.0);
  if (c->bias) t[BIAS] = mk(c->s, 1, wsh, 0, 0, 0, 0.2, 0.0);
  int nvec = (c->op == ADALN_LN || c->op == ADALN_RMS) ? 2 : is_mochi || c->op == GATED_RES ? 1 : 0;
  int which[2] = {c->op == ADALN_LN || c->op == ADALN_RMS ? SCALE : GATE, SHIFT};
  const fusedk_scalar ms = c->mod32 ? FUSEDK_F32 : c->s;
  for (int k = 0; k < nvec; ++k) {
    int64_t msh[2] = {c->B, 6 * c->D};
    if (c->vec_stride) { /* chunk k+1 of a [B, 6D] AdaLN-Zero modulation tensor */
      buf_t m = mk(ms, 2, msh, 0, 0, 0, 0.5, 0.0);
      m.shape[1] = c->D;
      m.off += (size_t)(k + 1) * c->D;
      m.th.byte_offset = m.td.byte_offset = m.off * esize(ms);
      t[which[k]] = m;
    } else {
      t[which[k]] = mk(ms, 2, vsh, 0, 0, c->vec_broadcast, 0.5, 0.0);
    }
  }
  if (c->special >= 2) { /* LayerNorm's second statistics pass: two rows in three with a mean 25-40 sd
                            from zero (2); (3) rows of mean 1000, sd 0.01, element 0 25-30 sd out */
    for (int64_t r = 0; r < c->B * c->L; ++r) {
      const size_t row = t[X].off + (size_t)((r / c->L) * t[X].strides[0] + (r % c->L) * t[X].strides[1]);
      if (r % 3 == 2) continue;
      if (c->special == 3)
        put(t[X].h, row, r % 3 ? 999.75 : 1000.3, c->s);
      else
        for (int64_t d = 0; d < c->D; ++d) put(t[X].h, row + d, get(t[X].h, row + d, c->s) + (r % 3 ? -25.0 : 40.0), c->s);
    }
    CK(cudaMemcpy(t[X].d, t[X].h, t[X].n_alloc * esize(c->s), cudaMemcpyHostToDevice));
  }
  if (c->special == 1 && c->B * c->L >= 2) { /* IEEE: the row of a NaN or an Inf is NaN, nothing hangs */
    put(t[X].h, t[X].off, NAN, c->s);
    put(t[X].h, t[X].off + (size_t)t[X].strides[1], INFINITY, c->s);
    CK(cudaMemcpy(t[X].d, t[X].h, t[X].n_alloc * esize(c->s), cudaMemcpyHostToDevice));
  }
  /* in place: the reference must read the original x, so run it on a host copy */
  buf_t ref_x = {0};
  if (c->inplace) {
    ref_x = mk(c->s, 3, sh3, c->pad, c->shift, 0, 1.0, 0.0);
    memcpy(ref_x.h, t[X].h, t[X].n_alloc * esize(c->s));
    t[Y].h = ref_x.h;
    t[Y].th.data = ref_x.h;
  }
  char what[200];
  snprintf(what, sizeof what, "%s %s [%lld,%lld,%lld]%s%s%s pad %lld shift %zu%s%s%s%s", op_name[c->op], sname(c->s),
           (long long)c->B, (long long)c->L, (long long)c->D, c->weight ? " w" : "", c->bias ? " b" : "",
           c->residual ? " res" : "", (long long)c->pad, c->shift, c->vec_stride ? " mod-view" : "",
           c->vec_broadcast ? " bcast" : "", c->inplace ? " inplace" : c->special >= 2 ? " rows far from zero" : "",
           c->mod32 ? " f32 modulation" : "");
  ++checks;
  fusedk_status sc = call(c->op, t, 0, 0);
  fusedk_status sg = call(c->op, t, 1, 0);
  int bad = call_failed(what, sc, sg);
  if (!bad) {
    bad += compare(what, &t[Y], is_mochi ? &t[X] : NULL, c->op == MOCHI_EXACT, eps_of(c->s), c->special != 1);
    if (t[RO].h) bad += compare(what, &t[RO], NULL, 0, eps_of(c->s), c->special != 1);
    if (!c->inplace) { /* determinism: a second run is bitwise identical */
      void *a = to_host(&t[Y]);
      call(c->op, t, 1, 0);
      void *b = to_host(&t[Y]);
      if (memcmp(a, b, t[Y].n_alloc * esize(c->s))) printf("  %s: second run differs\n", what), ++bad;
      free(a), free(b);
    }
    if (bad) printf("FAIL %s\n", what);
  }
  failures += bad != 0;
  if (c->inplace) t[Y].h = NULL, drop(&ref_x);
  for (int i = 0; i < NT; ++i)
    if (t[i].h) {
      if (i == SCALE || i == SHIFT || i == GATE) t[i].off = 0;
      drop(&t[i]);
    }
}

/* --- [position] rope and the table builders ------------------------------------------------ */

/* a float32 cos or sin table of kind tk: 2 [S, R/2], 3 [S, H, R/2], 4 [B, S, H, R/2], 5 the same
   broadcast over B (stride 0) */
static buf_t mk_table(int tk, int64_t B, int64_t S, int64_t H, int64_t R) {
  int64_t t2[2] = {S, R / 2}, t3[3] = {S, H, R / 2}, t4[4] = {B, S, tk == 5 ? 1 : H, R / 2};
  return tk == 2 ? mk(FUSEDK_F32, 2, t2, 0, 0, 0, 1.0, 0.0) : tk == 3 ? mk(FUSEDK_F32, 3, t3, 0, 0, 0, 1.0, 0.0)
                                                       : mk(FUSEDK_F32, 4, t4, 0, 0, tk == 5, 1.0, 0.0);
}

/* rope of q [B, S, Hq, Dh] and k [B, S, Hk, Dh] (Hk = 0: no k); tables of kind tk (mk_table);
   pad: strided heads; shift: misaligned bases (scalar path); inplace: q_out = q. */
typedef struct {
  fusedk_scalar s;
  int64_t B, S, Hq, Hk, Dh, R;
  int style, tk; /* fusedk_rope_style; the table kind (mk_table) */
  int64_t pad;
  size_t shift;
  int inplace;
} rope_t;

static void run_rope(rope_t c) {
  const fusedk_scalar s = c.s;
  const int64_t B = c.B, S = c.S, Hq = c.Hq, Hk = c.Hk, Dh = c.Dh, R = c.R, pad = c.pad;
  const int style = c.style, tk = c.tk, inplace = c.inplace;
  const size_t shift = c.shift;
  int64_t shp[2][4] = {{B, S, Hq, Dh}, {B, S, Hk, Dh}};
  buf_t in[2] = {{0}}, ref[2] = {{0}}, out[2] = {{0}}, tab[2];
  for (int j = 0; j < 1 + (Hk > 0); ++j) {
    in[j] = mk(s, 4, shp[j], pad, shift, 0, 1.0, 0.0);
    ref[j] = mk(s, 4, shp[j], pad, shift, 0, 0.0, 0.0); /* the CPU's output (host), poisoned */
    poison(&ref[j]);
    if (inplace) memcpy(ref[j].h, in[j].h, in[j].n_alloc * esize(s)); /* untouched channels */
  }
  for (int j = 0; j < 2; ++j) tab[j] = mk_table(tk, B, S, Hq, R);
  const fusedk_tensor *k_in = Hk ? &in[1].th : NULL, *k_out = Hk ? &ref[1].th : NULL;
  char what[200];
  snprintf(what, sizeof what, "rope(%s) %s q[%lld,%lld,%lld,%lld] Hk %lld R %lld table %d pad %lld shift %zu%s",
           style ? "half" : "interleaved", sname(s), (long long)B, (long long)S, (long long)Hq, (long long)Dh,
           (long long)Hk, (long long)R, tk, (long long)pad, shift, inplace ? " inplace" : "");
  ++checks;
  fusedk_status sc = fusedk_rope(&ref[0].th, k_out, &in[0].th, k_in, &tab[0].th, &tab[1].th,
                                 (fusedk_rope_style)style, (int32_t)R, NULL);
  for (int j = 0; j < 1 + (Hk > 0); ++j) { /* the GPU writes out[j]: in[j] itself in place */
    out[j] = ref[j];
    if (inplace) out[j].d = in[j].d, out[j].td.data = in[j].d;
  }
  fusedk_status sg = fusedk_rope(&out[0].td, Hk ? &out[1].td : NULL, &in[0].td, Hk ? &in[1].td : NULL, &tab[0].td,
                                 &tab[1].td, (fusedk_rope_style)style, (int32_t)R, NULL);
  int bad = call_failed(what, sc, sg);
  if (!bad) {
    for (int j = 0; j < 1 + (Hk > 0); ++j) bad += compare(what, &out[j], NULL, 0, eps_of(s), 1);
    if (bad) printf("FAIL %s\n", what);
  }
  failures += bad != 0;
  for (int j = 0; j < 2; ++j) drop(&in[j]), drop(&ref[j]), drop(&tab[j]);
}

/* qk_norm_rope of q [B, S, Hq, Dh], k and v [B, S, Hk, Dh] into `layout` ([B, H, S, Dh] or
   [B, S, H, Dh]), outputs with padded rows (the padding must stay poisoned); q_weight/k_weight
   ([Dh], or [H*Dh] for FULL) when `weights`; tables of kind tk as run_rope (3, 4: Hq == Hk);
   packed: q, k, v are views of one [B, S, 3, H, Dh] buffer (Hq == Hk), and with inplace (BSHD)
   the outputs are those views; pad: row padding of the inputs (strided heads); shift: leading
   elements of every tensor but the tables (misaligned bases: the scalar path). q8:
   qk_norm_rope_int8 (no v; int8 [B, S, H, Dh] and float32 [B, S, H] outputs, both padded). */
typedef struct {
  fusedk_scalar s;
  int64_t B, S, Hq, Hk, Dh, R; /* R 0: all of Dh */
  int style, norm, layout;     /* fusedk_rope_style, fusedk_qk_norm, fusedk_layout */
  int weights, no_v, tk, packed, inplace, q8;
  int64_t pad;
  size_t shift;
} qknr_t;

/* An int8 output against the reference: within one step (the float32 math against double may
   move x * 127 / amax across a half), on at most n / 1000 + 2 elements; -128 (the poison, which
   the quantizer never writes) nowhere in the view, nothing outside it written. */
static int compare_q8(const char *what, buf_t *o) {
  int8_t *g = (int8_t *)to_host(o);
  unsigned char *inview = view_mask(o);
  int bad = outside_written("  ", what, o, inview, g, o->h);
  size_t n = 0, steps = 0;
  for (size_t i = 0; i < o->n_alloc; ++i) {
    if (!inview[i]) continue;
    const int a = g[i], b = ((const int8_t *)o->h)[i];
    ++n, steps += a != b;
    if ((a == -128 || abs(a - b) > 1) && bad++ < 3) printf("  %s: element %zu gpu %d cpu %d\n", what, i, a, b);
  }
  if (steps > n / 1000 + 2 && bad++ < 3) printf("  %s: %zu of %zu elements a step off\n", what, steps, n);
  free(g);
  free(inview);
  return bad;
}

static const char *qk_norm_name(int n) { return n == FUSEDK_QK_NORM_HEAD ? "head" : n == FUSEDK_QK_NORM_FULL ? "full" : "none"; }

static void run_qknr(qknr_t c) {
  if (c.q8) c.no_v = 1, c.inplace = 0, c.layout = FUSEDK_LAYOUT_BSHD;
  const int nt = c.no_v ? 2 : 3, bhsd = c.layout == FUSEDK_LAYOUT_BHSD;
  const int64_t H[3] = {c.Hq, c.Hk, c.Hk}, R = c.R ? c.R : c.Dh, es = (int64_t)esize(c.s);
  buf_t in[3] = {{0}}, out[3] = {{0}}, w[2] = {{0}}, tab[2], pk = {0}, whole = {0}, sc[2] = {{0}};
  fusedk_tensor ti[3][2], to[3][2]; /* [tensor][0 host, 1 device] */
  int64_t vsh[4] = {c.B, c.S, c.Hq, c.Dh}, vst[4];
  void *ref_h = NULL; /* in place: the CPU's output, a host copy of the packed buffer */
  if (c.packed) { /* [B, S, 3*H, Dh] = [B, S, 3, H, Dh]: q, k, v at head offsets 0, H, 2H */
    int64_t psh[4] = {c.B, c.S, 3 * c.Hq, c.Dh};
    pk = mk(c.s, 4, psh, c.pad, c.shift, 0, 2.0, 0.25);
    memcpy(vst, pk.strides, sizeof vst);
    for (int j = 0; j < nt; ++j) {
      ti[j][0] = fusedk_tensor_cpu(pk.h, c.s, 4, vsh);
      ti[j][0].strides = vst;
      ti[j][0].byte_offset = (pk.off + (size_t)(j * c.Hq * vst[2])) * es;
      ti[j][1] = ti[j][0];
      ti[j][1].data = pk.d;
      ti[j][1].device.device_type = FUSEDK_DEVICE_CUDA;
    }
    if (c.inplace) {
      ref_h = malloc(pk.n_alloc * es);
      memcpy(ref_h, pk.h, pk.n_alloc * es);
      whole = pk, whole.h = ref_h; /* compared whole: device (in place) against the host copy */
      for (int j = 0; j < nt; ++j) to[j][0] = ti[j][0], to[j][0].data = ref_h, to[j][1] = ti[j][1];
    }
  } else {
    for (int j = 0; j < nt; ++j) {
      int64_t sh[4] = {c.B, c.S, H[j], c.Dh};
      in[j] = mk(c.s, 4, sh, c.pad, c.shift, 0, 2.0, 0.25);
      ti[j][0] = in[j].th, ti[j][1] = in[j].td;
    }
  }
  if (!c.inplace)
    for (int j = 0; j < nt; ++j) { /* the layout's shape, rows padded by 3 (q8: 8, whole vectors, if aligned) */
      int64_t sh[4] = {c.B, bhsd ? H[j] : c.S, bhsd ? c.S : H[j], c.Dh}, ssh[3] = {c.B, c.S, H[j]};
      out[j] = mk(c.q8 ? FUSEDK_I8 : c.s, 4, sh, c.q8 && !c.shift ? 8 : 3, c.shift, 0, 0.0, 0.0);
      poison(&out[j]);
      if (c.q8) { /* -128, which the quantizer never writes; the scales NaN */
        memset(out[j].h, 0x80, out[j].n_alloc);
        CK(cudaMemset(out[j].d, 0x80, out[j].n_alloc));
        sc[j] = mk(FUSEDK_F32, 3, ssh, 1, c.shift, 0, 0.0, 0.0);
        poison(&sc[j]);
      }
      to[j][0] = out[j].th, to[j][1] = out[j].td;
    }
  for (int j = 0; c.weights && c.norm != FUSEDK_QK_NORM_NONE && j < 2; ++j) {
    int64_t n = c.norm == FUSEDK_QK_NORM_FULL ? H[j] * c.Dh : c.Dh;
    w[j] = mk(c.s, 1, &n, 0, c.shift, 0, 0.2, 1.0);
  }
  for (int j = 0; j < 2; ++j) tab[j] = mk_table(c.tk, c.B, c.S, c.Hq, R);
  char what[240];
  snprintf(what, sizeof what, "qk_norm_rope%s(%s, %s, %s) %s q[%lld,%lld,%lld,%lld] Hk %lld R %lld table %d%s%s%s%s "
           "pad %lld shift %zu", c.q8 ? "_int8" : "", qk_norm_name(c.norm), c.style ? "half" : "interleaved", bhsd ? "bhsd" : "bshd",
           sname(c.s), (long long)c.B, (long long)c.S, (long long)c.Hq, (long long)c.Dh, (long long)c.Hk,
           (long long)c.R, c.tk, w[0].h ? " w" : "", c.no_v ? " no-v" : "", c.packed ? " packed" : "",
           c.inplace ? " inplace" : "", (long long)c.pad, c.shift);
  ++checks;
  fusedk_status st[2];
  for (int d = 0; d < 2 && c.q8; ++d) {
    const fusedk_scaled_tensor sq = {&to[0][d], d ? &sc[0].td : &sc[0].th}, sk = {&to[1][d], d ? &sc[1].td : &sc[1].th};
    st[d] = fusedk_qk_norm_rope_int8(&sq, &sk, &ti[0][d], &ti[1][d], d ? &tab[0].td : &tab[0].th,
                                     d ? &tab[1].td : &tab[1].th, w[0].h ? (d ? &w[0].td : &w[0].th) : NULL,
                                     w[1].h ? (d ? &w[1].td : &w[1].th) : NULL, 1e-6f, (fusedk_qk_norm)c.norm,
                                     (fusedk_rope_style)c.style, (int32_t)c.R, NULL);
  }
  for (int d = 0; d < 2 && !c.q8; ++d)
    st[d] = fusedk_qk_norm_rope(&to[0][d], &to[1][d], c.no_v ? NULL : &to[2][d], &ti[0][d], &ti[1][d],
                                c.no_v ? NULL : &ti[2][d], d ? &tab[0].td : &tab[0].th, d ? &tab[1].td : &tab[1].th,
                                w[0].h ? (d ? &w[0].td : &w[0].th) : NULL, w[1].h ? (d ? &w[1].td : &w[1].th) : NULL,
                                1e-6f, (fusedk_qk_norm)c.norm, (fusedk_rope_style)c.style, (fusedk_layout)c.layout,
                                (int32_t)c.R, NULL);
  int bad = call_failed(what, st[0], st[1]);
  if (!bad) {
    if (c.inplace) bad += compare(what, &whole, NULL, 0, eps_of(c.s), 1);
    for (int j = 0; !c.inplace && !c.q8 && j < nt; ++j) bad += compare(what, &out[j], NULL, 0, eps_of(c.s), 1);
    for (int j = 0; c.q8 && j < 2; ++j) bad += compare_q8(what, &out[j]) + compare(what, &sc[j], NULL, 0, 1e-5, 1);
    if (bad) printf("FAIL %s\n", what);
  }
  failures += bad != 0;
  free(ref_h);
  for (int j = 0; j < 3; ++j) drop(&in[j]), drop(&out[j]);
  drop(&w[0]), drop(&w[1]), drop(&tab[0]), drop(&tab[1]), drop(&pk), drop(&sc[0]), drop(&sc[1]);
}

/* the four table builders, GPU against the CPU reference (both float64 angles, one rounding) */
static void run_tables(int64_t S) {
  int64_t s1[1] = {S}, s3[2] = {S, 3}, fr[3] = {3, 24, 64}, o1[2] = {S, 64}, o2[2] = {S, 64}, o3[2] = {S, 1024},
          o4[3] = {S, 24, 64};
  buf_t pos = mk(FUSEDK_F32, 1, s1, 0, 0, 0, 300.0, 0.0), ids = mk(FUSEDK_F32, 2, s3, 0, 0, 0, 40.0, 0.0);
  buf_t crd = mk(FUSEDK_F32, 2, s3, 0, 0, 0, 0.4, 0.5), frq = mk(FUSEDK_F32, 3, fr, 0, 0, 0, 0.1, 0.0);
  buf_t pos3 = mk(FUSEDK_F32, 2, s3, 0, 0, 0, 20.0, 0.0);
  const int32_t axes[3] = {16, 56, 56};
  for (int op = 0; op < 4; ++op) {
    const int64_t *osh = op == 0 ? o1 : op == 1 ? o2 : op == 2 ? o3 : o4;
    buf_t t[2];
    for (int j = 0; j < 2; ++j) {
      t[j] = mk(FUSEDK_F32, op == 3 ? 3 : 2, osh, op == 1 ? 5 : 0, 0, 0, 0.0, 0.0); /* axes: padded rows */
      poison(&t[j]);
    }
    fusedk_status st[2];
    for (int dev = 0; dev < 2; ++dev) {
      const fusedk_tensor *c = dev ? &t[0].td : &t[0].th, *sn = dev ? &t[1].td : &t[1].th;
#define FUSEDK__T(b) (dev ? &(b).td : &(b).th)
      st[dev] = op == 0   ? fusedk_rope_table_1d(c, sn, FUSEDK__T(pos), 128, 10000.f, NULL)
                : op == 1 ? fusedk_rope_table_axes(c, sn, FUSEDK__T(ids), axes, 3, 10000.f, NULL)
                : op == 2 ? fusedk_rope_table_ltx(c, sn, FUSEDK__T(crd), 2048, 10000.f, NULL)
                          : fusedk_rope_table_mixed(c, sn, FUSEDK__T(pos3), FUSEDK__T(frq), NULL);
#undef FUSEDK__T
    }
    const char *names[4] = {"rope_table_1d", "rope_table_axes", "rope_table_ltx", "rope_table_mixed"};
    char what[96];
    snprintf(what, sizeof what, "%s S=%lld", names[op], (long long)S);
    ++checks;
    int bad = call_failed(what, st[0], st[1]);
    if (!bad) {
      bad = compare(what, &t[0], NULL, 0, 0x1p-22, 1) + compare(what, &t[1], NULL, 0, 0x1p-22, 1);
      if (bad) printf("FAIL %s\n", what);
    }
    failures += bad != 0;
    drop(&t[0]), drop(&t[1]);
  }
  drop(&pos), drop(&ids), drop(&crd), drop(&frq), drop(&pos3);
}

/* --- [linear] linear and linear_backward against the CPU references ------------------------
   Tolerance: eps_T * |cpu| (the output's rounding) + 2^-19 * S1 (float32 accumulation against
   double; S1 = the sum of |terms|, from the reference run on absolute values, times the largest
   |act'| (1.13) where an act derivative is in it) + 2^-10 * S1 with TF32 (its 10-bit inputs);
   GELU/SILU's y = act(z rounded): + eps_T * 1.13 * |z|, a flip of z's rounding; the backward's
   dz rounded on both sides: + 4 eps_T * S1 / sqrt(terms), a few flips among the terms. */
static double grad_rounded; /* the low-rank backward's roundings of dh and g: lin_tol adds grad_rounded * s1 */
static double lin_tol(double cpu, double s1, int64_t terms, fusedk_scalar s, int tf32, int flips, double z) {
  const double e = eps_of(s);
  double t = e * fabs(cpu) + (0x1p-19 + grad_rounded) * s1 + (tf32 ? 0x1p-10 * s1 : 0.0) + 1e-6 + e * 1.13 * fabs(z);
  if (flips) t += 4.0 * e * s1 / sqrt((double)(terms > 0 ? terms : 1));
  return t;
}
/* host copy of b with |values| (same layout) as a CPU tensor, for the bound S1 */
static buf_t lin_abs(const buf_t *b, double scale) {
  buf_t a = *b;
  a.h = malloc(b->n_alloc * esize(b->s));
  for (size_t i = 0; i < b->n_alloc; ++i) put(a.h, i, fabs(get(b->h, i, b->s)) * scale, b->s);
  a.th.data = a.h;
  a.d = NULL;
  return a;
}
/* GPU result (copied back) of o against its CPU result (host of o holds the CPU's), bound
   s1 * g1 (g1: the largest |act'| where one is in the terms, else 1); what + part names it */
static int lin_compare(const char *what, const char *part, buf_t *o, const void *cpu_h, const buf_t *s1, double g1,
                       int64_t terms, int tf32, int flips, const buf_t *z) {
  char name[240];
  snprintf(name, sizeof name, "%s%s", what, part);
  void *g = to_host(o);
  int bad = 0;
  const int64_t n = view_count(o);
  for (int64_t i = 0; i < n && bad < 3; ++i) {
    const size_t k = view_at(o, i);
    const double c = get(cpu_h, k, o->s), v = get(g, k, o->s);
    const double t = lin_tol(c, s1 ? g1 * get(s1->h, view_at(s1, i), o->s) : 0.0, terms, o->s, tf32, flips,
                             z ? get(z->h, view_at(z, i), o->s) : 0.0);
    if (!(fabs(v - c) <= t)) {
      printf("FAIL %s: element %lld gpu %.6g cpu %.6g tol %.3g\n", name, (long long)i, v, c, t);
      ++bad;
    }
  }
  unsigned char *inview = view_mask(o); /* padding and shift: untouched on both sides */
  bad += outside_written("FAIL ", name, o, inview, g, cpu_h);
  free(inview);
  free(g);
  ++checks;
  if (bad) ++failures;
  return !bad;
}
static const char *act_name(int a) {
  static const char *n[] = {"gelu", "gelu_tanh", "silu", "relu", "none"};
  return n[a];
}

/* One forward and backward case: x [B, L, K] (rows padded by pad, base shifted by shift
   elements), w [N, K], bias [N]; y, aux [B, L, N]; dx, dw, db. */
typedef struct {
  fusedk_scalar s;
  int64_t B, L, N, K;
  int act, bias, aux, tf32; /* fusedk_activation; bias given; aux_out asked for; TF32 tensor cores */
  int64_t pad;
  size_t shift;
} linear_t;

static void run_linear(linear_t c) {
  const fusedk_scalar s = c.s;
  const int64_t B = c.B, L = c.L, N = c.N, K = c.K, pad = c.pad;
  const int act = c.act, bias = c.bias, aux = c.aux, tf32 = c.tf32;
  const size_t shift = c.shift;
  char what[160];
  snprintf(what, sizeof what, "linear %s [%lld,%lld,%lld] N=%lld act=%s%s%s%s pad=%lld shift=%zu", sname(s),
           (long long)B, (long long)L, (long long)K, (long long)N, act_name(act), bias ? " bias" : "",
           aux ? " aux" : "", tf32 ? " tf32" : "", (long long)pad, shift);
  const int64_t xs[3] = {B, L, K}, ws[2] = {N, K}, bs[1] = {N}, ys[3] = {B, L, N};
  buf_t x = mk(s, 3, xs, pad, shift, 0, 1.0, 0.0), w = mk(s, 2, ws, pad, 0, 0, 1.0 / sqrt((double)(K ? K : 1)), 0.0);
  buf_t b = mk(s, 1, bs, 0, 0, 0, 0.5, 0.0), y = mk(s, 3, ys, pad, shift, 0, 0.0, 0.0), z = mk(s, 3, ys, 0, 0, 0, 0.0, 0.0);
  poison(&y), poison(&z);
  const int need_z = aux || act != FUSEDK_ACT_NONE; /* the backward needs it */
  fusedk_status sc = fusedk_linear(&y.th, need_z ? &z.th : NULL, &x.th, &w.th, bias ? &b.th : NULL, (fusedk_activation)act, tf32, NULL);
  fusedk_status sg = fusedk_linear(&y.td, aux ? &z.td : NULL, &x.td, &w.td, bias ? &b.td : NULL, (fusedk_activation)act, tf32, NULL);
  CK(cudaDeviceSynchronize());
  if (call_failed_counted(what, sc, sg)) goto out;
  {
    buf_t xa = lin_abs(&x, 1.0), wa = lin_abs(&w, 1.0), ba = lin_abs(&b, 1.0), s1 = lin_abs(&y, 0.0);
    const double g = act == FUSEDK_ACT_NONE || act == FUSEDK_ACT_RELU ? 1.0 : 1.13;
    fusedk_linear(&s1.th, NULL, &xa.th, &wa.th, bias ? &ba.th : NULL, FUSEDK_ACT_NONE, 0, NULL);
    const int two_pass = act == FUSEDK_ACT_GELU || act == FUSEDK_ACT_SILU;
    lin_compare(what, "", &y, y.h, &s1, g, K, tf32, 0, two_pass ? &z : NULL);
    if (aux) lin_compare(what, " (aux)", &z, z.h, &s1, 1.0, K, tf32, 0, NULL);
    /* backward from the CPU's aux, on both sides */
    buf_t dy = mk(s, 3, ys, pad, 0, 0, 1.0, 0.0), dx = mk(s, 3, xs, 0, shift, 0, 0.0, 0.0), dw = mk(s, 2, ws, 0, 0, 0, 0.0, 0.0);
    buf_t db = mk(s, 1, bs, 0, 0, 0, 0.0, 0.0);
    poison(&dx), poison(&dw), poison(&db);
    CK(cudaMemcpy(z.d, z.h, z.n_alloc * esize(s), cudaMemcpyHostToDevice));
    const fusedk_tensor *zc = act == FUSEDK_ACT_NONE ? NULL : &z.th, *zg = act == FUSEDK_ACT_NONE ? NULL : &z.td;
    char bw[200];
    snprintf(bw, sizeof bw, "%s backward", what);
    sc = fusedk_linear_backward(&dx.th, &dw.th, &db.th, &dy.th, &x.th, &w.th, zc, (fusedk_activation)act, tf32, NULL);
    sg = fusedk_linear_backward(&dx.td, &dw.td, &db.td, &dy.td, &x.td, &w.td, zg, (fusedk_activation)act, tf32, NULL);
    CK(cudaDeviceSynchronize());
    if (!call_failed_counted(bw, sc, sg)) {
      buf_t dya = lin_abs(&dy, g), dxa = lin_abs(&dx, 0.0), dwa = lin_abs(&dw, 0.0), dba = lin_abs(&db, 0.0);
      fusedk_linear_backward(&dxa.th, &dwa.th, &dba.th, &dya.th, &xa.th, &wa.th, NULL, FUSEDK_ACT_NONE, 0, NULL);
      const int flips = act != FUSEDK_ACT_NONE;
      lin_compare(bw, " dx", &dx, dx.h, &dxa, 1.0, N, tf32, flips, NULL);
      lin_compare(bw, " dw", &dw, dw.h, &dwa, 1.0, B * L, tf32, flips, NULL);
      lin_compare(bw, " db", &db, db.h, &dba, 1.0, B * L, 0, flips, NULL);
      /* dx alone (no db: the dz pass without column sums) gives dx's bits again */
      {
        buf_t dx2 = mk(s, 3, xs, 0, shift, 0, 0.0, 0.0);
        poison(&dx2); /* as dx was: the element before a shifted view stays poisoned */
        fusedk_status s2 = fusedk_linear_backward(&dx2.td, NULL, NULL, &dy.td, &x.td, &w.td, zg, (fusedk_activation)act, tf32, NULL);
        void *h1 = to_host(&dx), *h2 = to_host(&dx2);
        ++checks;
        if (s2 || memcmp(h1, h2, dx.n_alloc * esize(s))) printf("FAIL %s: dx alone differs from dx with dw, db\n", bw), ++failures;
        free(h1), free(h2);
        drop(&dx2);
      }
      /* deterministic: the same call again gives the same bits */
      void *h1 = to_host(&db);
      fusedk_linear_backward(NULL, NULL, &db.td, &dy.td, &x.td, &w.td, zg, (fusedk_activation)act, tf32, NULL);
      void *h2 = to_host(&db);
      ++checks;
      if (memcmp(h1, h2, db.n_alloc * esize(s))) printf("FAIL %s: db differs run to run\n", bw), ++failures;
      free(h1), free(h2);
      free(dya.h), free(dxa.h), free(dwa.h), free(dba.h);
    }
    drop(&dy), drop(&dx), drop(&dw), drop(&db);
    free(xa.h), free(wa.h), free(ba.h), free(s1.h);
  }
out:
  drop(&x), drop(&w), drop(&b), drop(&y), drop(&z);
}

/* FUSEDK_LINEAR_TUNE=2 and 3 on GEMMs large enough to be tuned (2 M N K >= 1e10): the
   algorithms the wider searches time and keep (tiles, custom options and cluster shapes the
   heuristic did not offer) compute the same GEMM: every 61st row against the CPU (the other
   rows: the GPU's own) */
static void run_linear_tuned(const char *level) {
  const fusedk_scalar s = FUSEDK_BF16;
  const int64_t M = 2048, K = 1280, N = 2048, E = 61, R = (M + E - 1) / E;
  setenv("FUSEDK_LINEAR_TUNE", level, 1);
  fusedk_shutdown(); /* plans made again, at this level */
  const int64_t xs[2] = {M, K}, ws[2] = {N, K}, bs[1] = {N}, ys[2] = {M, N};
  buf_t x = mk(s, 2, xs, 0, 0, 0, 1.0, 0.0), w = mk(s, 2, ws, 0, 0, 0, 1.0 / sqrt((double)K), 0.0);
  buf_t b = mk(s, 1, bs, 0, 0, 0, 0.5, 0.0), y = mk(s, 2, ys, 0, 0, 0, 0.0, 0.0), z = mk(s, 2, ys, 0, 0, 0, 0.0, 0.0);
  buf_t xa = lin_abs(&x, 1.0), wa = lin_abs(&w, 1.0), ba = lin_abs(&b, 1.0), s1 = lin_abs(&y, 0.0);
  int64_t sh_x[2] = {R, K}, st_x[2] = {E * K, 1}, sh_y[2] = {R, N}, st_y[2] = {E * N, 1};
  fusedk_tensor xv = x.th, xav = xa.th, yv = y.th, zv = z.th, s1v = s1.th;
  xv.shape = xav.shape = sh_x, xv.strides = xav.strides = st_x;
  yv.shape = zv.shape = s1v.shape = sh_y, yv.strides = zv.strides = s1v.strides = st_y;
  buf_t yc = y, zc = z, s1c = s1; /* the sampled rows, for lin_compare */
  yc.shape = zc.shape = s1c.shape = sh_y, yc.strides = zc.strides = s1c.strides = st_y;
  if (call_failed_counted("linear tuned: the CPU bound", fusedk_linear(&s1v, NULL, &xav, &wa.th, &ba.th, FUSEDK_ACT_NONE, 0, NULL),
                          FUSEDK_OK))
    goto out;
  const int acts[3] = {FUSEDK_ACT_NONE, FUSEDK_ACT_RELU, FUSEDK_ACT_GELU_TANH};
  for (int i = 0; i < 3; ++i) {
    const int act = acts[i], aux = act == FUSEDK_ACT_GELU_TANH;
    char what[120];
    snprintf(what, sizeof what, "linear tuned (FUSEDK_LINEAR_TUNE=%s) bf16 [%lld,%lld] N=%lld act=%s bias%s", level,
             (long long)M, (long long)K, (long long)N, act_name(act), aux ? " aux" : "");
    poison(&y), poison(&z);
    const fusedk_status sg = fusedk_linear(&y.td, aux ? &z.td : NULL, &x.td, &w.td, &b.td, (fusedk_activation)act, 0, NULL);
    CK(cudaDeviceSynchronize());
    if (call_failed_counted(what, FUSEDK_OK, sg)) continue;
    CK(cudaMemcpy(y.h, y.d, y.n_alloc * esize(s), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(z.h, z.d, z.n_alloc * esize(s), cudaMemcpyDeviceToHost));
    /* the sampled rows overwritten by the CPU: a refused call would leave the GPU's there */
    const fusedk_status sc = fusedk_linear(&yv, aux ? &zv : NULL, &xv, &w.th, &b.th, (fusedk_activation)act, 0, NULL);
    if (call_failed_counted(what, sc, FUSEDK_OK)) continue;
    if (aux) lin_compare(what, " (aux)", &zc, z.h, &s1c, 1.0, K, 0, 0, NULL);
    lin_compare(what, "", &yc, y.h, &s1c, aux ? 1.13 : 1.0, K, 0, 0, NULL); /* |gelu'| <= 1.13 */
  }
out:
  unsetenv("FUSEDK_LINEAR_TUNE");
  fusedk_shutdown();
  free(xa.h), free(wa.h), free(ba.h), free(s1.h);
  drop(&x), drop(&w), drop(&b), drop(&y), drop(&z);
}

/* linear inside a CUDA graph on a fresh stream (its workspace made during the capture), then
   replayed on new inputs; and after fusedk_shutdown the next call makes everything again */
static void run_linear_graph(void) {
  const fusedk_scalar s = FUSEDK_BF16;
  const int64_t xs[3] = {1, 64, 256}, ws[2] = {128, 256}, bs[1] = {128}, ys[3] = {1, 64, 128};
  buf_t x = mk(s, 3, xs, 0, 0, 0, 1.0, 0.0), w = mk(s, 2, ws, 0, 0, 0, 0.0625, 0.0), b = mk(s, 1, bs, 0, 0, 0, 0.5, 0.0);
  buf_t y = mk(s, 3, ys, 0, 0, 0, 0.0, 0.0), z = mk(s, 3, ys, 0, 0, 0, 0.0, 0.0), dy = mk(s, 3, ys, 0, 0, 0, 1.0, 0.0);
  buf_t dx = mk(s, 3, xs, 0, 0, 0, 0.0, 0.0), dw = mk(s, 2, ws, 0, 0, 0, 0.0, 0.0), db = mk(s, 1, bs, 0, 0, 0, 0.0, 0.0);
  cudaStream_t st;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  fusedk_status a = fusedk_linear(&y.td, &z.td, &x.td, &w.td, &b.td, FUSEDK_ACT_GELU_TANH, 0, st);
  fusedk_status c = fusedk_linear_backward(&dx.td, &dw.td, &db.td, &dy.td, &x.td, &w.td, &z.td, FUSEDK_ACT_GELU_TANH, 0, st);
  CK(cudaStreamEndCapture(st, &g));
  ++checks;
  if (a || c) {
    printf("FAIL linear graph capture: %s\n", fusedk_failure_reason());
    ++failures;
  } else {
    CK(cudaGraphInstantiate(&ge, g, 0));
    { /* a larger backward on the same stream grows its scratch: the graph keeps the old buffer */
      const int64_t bx[2] = {512, 256}, bw[2] = {1024, 256}, by[2] = {512, 1024};
      buf_t X = mk(s, 2, bx, 0, 0, 0, 1.0, 0.0), W = mk(s, 2, bw, 0, 0, 0, 0.0625, 0.0), Y = mk(s, 2, by, 0, 0, 0, 1.0, 0.0);
      buf_t DX = mk(s, 2, bx, 0, 0, 0, 0.0, 0.0), DB = mk(s, 1, bw, 0, 0, 0, 0.0, 0.0); /* DB: [1024] */
      if (fusedk_linear_backward(&DX.td, NULL, &DB.td, &Y.td, &X.td, &W.td, &Y.td, FUSEDK_ACT_RELU, 0, st))
        printf("FAIL linear: the larger backward: %s\n", fusedk_failure_reason()), ++failures;
      CK(cudaStreamSynchronize(st));
      drop(&X), drop(&W), drop(&Y), drop(&DX), drop(&DB);
    }
    for (size_t i = 0; i < x.n_alloc; ++i) put(x.h, i, nrand(), s); /* new inputs, then replay */
    CK(cudaMemcpy(x.d, x.h, x.n_alloc * esize(s), cudaMemcpyHostToDevice));
    poison(&y), poison(&dw); /* synchronizes the copy too */
    CK(cudaGraphLaunch(ge, st));
    CK(cudaStreamSynchronize(st));
    fusedk_linear(&y.th, &z.th, &x.th, &w.th, &b.th, FUSEDK_ACT_GELU_TANH, 0, NULL);
    fusedk_linear_backward(NULL, &dw.th, NULL, &dy.th, &x.th, &w.th, &z.th, FUSEDK_ACT_GELU_TANH, 0, NULL);
    buf_t xa = lin_abs(&x, 1.0), wa = lin_abs(&w, 1.0), ba = lin_abs(&b, 1.0), s1 = lin_abs(&y, 0.0);
    buf_t dya = lin_abs(&dy, 1.13), dwa = lin_abs(&dw, 0.0);
    fusedk_linear(&s1.th, NULL, &xa.th, &wa.th, &ba.th, FUSEDK_ACT_NONE, 0, NULL);
    fusedk_linear_backward(NULL, &dwa.th, NULL, &dya.th, &xa.th, &wa.th, NULL, FUSEDK_ACT_NONE, 0, NULL);
    lin_compare("linear graph replay y", "", &y, y.h, &s1, 1.0, 256, 0, 0, NULL);
    lin_compare("linear graph replay dw", "", &dw, dw.h, &dwa, 1.0, 64, 0, 1, NULL);
    free(xa.h), free(wa.h), free(ba.h), free(s1.h), free(dya.h), free(dwa.h);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
  }
  fusedk_shutdown();
  poison(&y);
  a = fusedk_linear(&y.td, NULL, &x.td, &w.td, &b.td, FUSEDK_ACT_RELU, 0, st);
  CK(cudaStreamSynchronize(st));
  fusedk_linear(&y.th, NULL, &x.th, &w.th, &b.th, FUSEDK_ACT_RELU, 0, NULL);
  if (a) printf("FAIL linear after shutdown: %s\n", fusedk_failure_reason()), ++failures, ++checks;
  else lin_compare("linear after fusedk_shutdown", "", &y, y.h, NULL, 1.0, 256, 0, 0, NULL);
  CK(cudaStreamDestroy(st));
  drop(&x), drop(&w), drop(&b), drop(&y), drop(&z), drop(&dy), drop(&dx), drop(&dw), drop(&db);
}

/* --- [attention] attention against the CPU reference ------------------------------------------
   q [B, Sq, Hq, Dh], k, v [B, Sk, Hq / G, Dh]. layout 0: [B, S, H, D] tensors (pad: row padding);
   1: [B, H, S, D] buffers seen through transposed views (out too); 2: q, k, v as views of one
   packed [B, S, 3, H, Dh] projection (Sq = Sk, G = 1). kv: kv_len {0, 1, Sk / 2, Sk, Sk + 5, -3}
   (the device clamps the last two; the reference, which refuses them, gets Sk and 0)
   cycled over B. special 1: q scaled 30x (scores far past exp's range unshifted); 2: key 5 of kv
   head 0 is NaN (the rows that see it are NaN, no other); 3: k's elements offset by 3 (k's
   mean, which attention_int8 takes off). shift: misaligned bases (attention's element path,
   attention_int8's copy of v). Tolerance: out within eps_T (|cpu| + max|v|) (P rounds to T
   before P V, one rounding of each weight), lse within 2^-20 (|cpu| + the largest |score|
   possible) (float32 scores).
   int8 (attention_int8): the reference quantizes q and k as the GPU does (P, v as attention's):
   out as attention's; lse within 2^-18 (|cpu| + the largest score) (scores from int32 sums
   times float32 scales, q . mean(k) summed in float32). */
typedef struct {
  fusedk_scalar s;
  int64_t B, Sq, Sk, Hq, G, Dh;
  int causal, layout, kv, special, int8;
  int64_t pad;
  size_t shift;
  float scale;
} attn_t;

/* a [B, S, H, D] tensor: compact (+pad) or, layout 1, a [B, H, S, D] buffer's transposed view */
static buf_t mk_bshd(const attn_t *c, int64_t S, int64_t H, double scale, double mean) {
  const int64_t shp[4] = {c->B, c->layout == 1 ? H : S, c->layout == 1 ? S : H, c->Dh};
  buf_t b = mk(c->s, 4, shp, c->pad, c->shift, 0, scale, mean);
  if (c->layout == 1) {
    int64_t t = b.shape[1];
    b.shape[1] = b.shape[2], b.shape[2] = t, t = b.strides[1], b.strides[1] = b.strides[2], b.strides[2] = t;
  }
  return b;
}
static double max_abs(const buf_t *b) {
  double m = 0;
  for (int64_t i = 0, n = view_count(b); i < n; ++i) m = fmax(m, fabs(get(b->h, view_at(b, i), b->s)));
  return m;
}
/* a float32 buffer like o's allocation, every element v: compare()'s aux term */
static buf_t mk_const(const buf_t *o, double v) {
  buf_t a = mk(FUSEDK_F32, o->ndim, o->shape, 0, 0, 0, 0.0, 0.0);
  free(a.h), a.h = malloc(o->n_alloc * 4), a.n_alloc = o->n_alloc;
  for (size_t i = 0; i < o->n_alloc; ++i) put(a.h, i, v, FUSEDK_F32);
  return a;
}

static void run_attn(attn_t c) {
  const fusedk_scalar s = c.s;
  const int64_t B = c.B, Sq = c.Sq, Sk = c.Sk, Hq = c.Hq, Hkv = c.Hq / c.G, Dh = c.Dh;
  buf_t qkv = {0}, q = {0}, k = {0}, v = {0};
  fusedk_tensor in_h[3], in_d[3];
  int64_t pshape[4] = {B, Sq, Hq, Dh}, pstr[4];
  if (c.layout == 2) { /* one [B, S, 3 H, Dh] buffer; q, k, v its thirds along the head dim */
    const int64_t shp[4] = {B, Sq, 3 * Hq, Dh};
    qkv = mk(s, 4, shp, c.pad, c.shift, 0, 1.0, 0.0);
    memcpy(pstr, qkv.strides, sizeof pstr);
    for (int j = 0; j < 3; ++j) {
      in_h[j] = qkv.th, in_d[j] = qkv.td;
      in_h[j].shape = in_d[j].shape = pshape, in_h[j].strides = in_d[j].strides = pstr;
      in_h[j].byte_offset = in_d[j].byte_offset = qkv.th.byte_offset + (uint64_t)(j * Hq * pstr[2]) * esize(s);
    }
  } else {
    q = mk_bshd(&c, Sq, Hq, c.special == 1 ? 30.0 : 1.0, 0.0), k = mk_bshd(&c, Sk, Hkv, 1.0, c.special == 3 ? 3.0 : 0.0);
    v = mk_bshd(&c, Sk, Hkv, 1.0, 0.0);
    if (c.special == 2 && Sk > 5) { /* key 5 of batch 0, kv head 0: NaN on both sides */
      const size_t at = k.off + (size_t)(5 * k.strides[1]);
      put(k.h, at, NAN, s);
      CK(cudaMemcpy((char *)k.d + at * esize(s), (char *)k.h + at * esize(s), esize(s), cudaMemcpyHostToDevice));
    }
    in_h[0] = q.th, in_h[1] = k.th, in_h[2] = v.th, in_d[0] = q.td, in_d[1] = k.td, in_d[2] = v.td;
  }
  buf_t out = mk_bshd(&c, Sq, Hq, 0.0, 0.0);
  const int64_t lshape[3] = {B, Hq, Sq};
  buf_t lse = mk(FUSEDK_F32, 3, lshape, 0, 0, 0, 0.0, 0.0);
  poison(&out), poison(&lse);
  int32_t *kvh = NULL, *kvd = NULL;
  fusedk_tensor kv_h, kv_d;
  int64_t kshape[1] = {B};
  if (c.kv) {
    kvh = malloc((size_t)B * 4);
    const int64_t pick[6] = {0, 1, Sk / 2, Sk, Sk + 5, -3};
    for (int64_t b = 0; b < B; ++b) kvh[b] = (int32_t)pick[b % 6];
    CK(cudaMalloc((void **)&kvd, (size_t)B * 4));
    CK(cudaMemcpy(kvd, kvh, (size_t)B * 4, cudaMemcpyHostToDevice));
    for (int64_t b = 0; b < B; ++b) /* the device clamps Sk + 5 and -3; the host refuses them: Sk and 0 there */
      kvh[b] = kvh[b] < 0 ? 0 : kvh[b] > Sk ? (int32_t)Sk : kvh[b];
    kv_h = fusedk_tensor_cpu(kvh, FUSEDK_I32, 1, kshape), kv_d = kv_h;
    kv_d.data = kvd, kv_d.device.device_type = FUSEDK_DEVICE_CUDA;
  }
  char what[240];
  snprintf(what, sizeof what, "attention%s %s B%lld Sq%lld Sk%lld Hq%lld G%lld Dh%lld%s layout %d%s%s%s pad %lld "
           "shift %zu scale %g", c.int8 ? "_int8" : "", sname(s), (long long)B, (long long)Sq, (long long)Sk, (long long)Hq, (long long)c.G,
           (long long)Dh, c.causal ? " causal" : "", c.layout, c.kv ? " kv_len" : "",
           c.special == 1 ? " huge" : c.special == 2 ? " nan-key" : c.special == 3 ? " k+3" : "", "", (long long)c.pad, c.shift, (double)c.scale);
  ++checks;
  fusedk_status (*f)(const fusedk_tensor *, const fusedk_tensor *, const fusedk_tensor *, const fusedk_tensor *,
                     const fusedk_tensor *, const fusedk_tensor *, float, int32_t, struct CUstream_st *) =
      c.int8 ? fusedk_attention_int8 : fusedk_attention;
  fusedk_status sc = f(&out.th, &lse.th, &in_h[0], &in_h[1], &in_h[2], c.kv ? &kv_h : NULL, c.scale, c.causal, NULL);
  fusedk_status sg = f(&out.td, &lse.td, &in_d[0], &in_d[1], &in_d[2], c.kv ? &kv_d : NULL, c.scale, c.causal, NULL);
  /* the int8 kernel's refusal without sm_90a code (or with FUSEDK_NO_TMA): skipped, not counted */
  const int skip = c.int8 && sg == FUSEDK_ERR_UNSUPPORTED && strstr(fusedk_failure_reason(), "sm_90a");
  if (skip) printf("SKIPPED %s: %s\n", what, fusedk_failure_reason()), --checks;
  int bad = skip ? 0 : call_failed(what, sc, sg);
  if (!bad && !skip) {
    const buf_t *vb = c.layout == 2 ? &qkv : &v, *qb = c.layout == 2 ? &qkv : &q, *kb = c.layout == 2 ? &qkv : &k;
    const double vmax = max_abs(vb), scale = c.scale != 0.0f ? fabs(c.scale) : 1.0 / sqrt((double)Dh);
    double smax = scale * (double)Dh * max_abs(qb) * max_abs(kb);
    if (isnan(smax)) smax = 0; /* the NaN key: its rows are NaN on both sides */
    buf_t ao = mk_const(&out, vmax), al = mk_const(&lse, smax);
    bad += compare(what, &out, &ao, 0, eps_of(s), c.special != 2);
    bad += compare(what, &lse, &al, 0, c.int8 ? 0x1p-18 : 0x1p-20, c.special != 2);
    drop(&ao), drop(&al);
    if (bad) printf("FAIL %s\n", what);
  }
  failures += bad != 0;
  if (c.kv) {
    free(kvh);
    CK(cudaFree(kvd));
  }
  drop(&qkv), drop(&q), drop(&k), drop(&v), drop(&out), drop(&lse);
}

/* attention_int8_scaled: int8 q and k (N(0, 50) rounded and clamped) with float32 scales (q's a
   view with a padded last dim: strided), against the CPU reference on the same values. Bounds
   as attention_int8's: out eps_T (|cpu| + max|v|), lse 2^-18 (|cpu| + the largest score). kv:
   kv_len (Sk, 0, Sk / 2, 1, cycled over B). mode 1: q.data's base one byte off, which the GPU
   refuses by name (the CPU runs it); 2: negative scales (their magnitudes count). */
static void run_attn_scaled(fusedk_scalar s, int64_t B, int64_t Sq, int64_t Sk, int64_t Hq, int64_t G, int64_t Dh,
                            int causal, int kv, float scale, int mode) {
  const int64_t Hkv = Hq / G, qsh[4] = {B, Sq, Hq, Dh}, ksh[4] = {B, Sk, Hkv, Dh}, lsh[3] = {B, Hq, Sq};
  const int misalign = mode == 1;
  const double sm = mode == 2 ? -0.02 : 0.02; /* the scales' mean */
  buf_t q8 = mk(FUSEDK_I8, 4, qsh, 0, misalign ? 1 : 0, 0, 50.0, 0.0), qs = mk(FUSEDK_F32, 3, qsh, 3, 0, 0, 0.004, sm);
  buf_t k8 = mk(FUSEDK_I8, 4, ksh, 0, 0, 0, 50.0, 0.0), ks = mk(FUSEDK_F32, 3, ksh, 0, 0, 0, 0.004, sm);
  buf_t v = mk(s, 4, ksh, 0, 0, 0, 1.0, 0.0), out = mk(s, 4, qsh, 0, 0, 0, 0.0, 0.0);
  buf_t lse = mk(FUSEDK_F32, 3, lsh, 0, 0, 0, 0.0, 0.0);
  poison(&out), poison(&lse);
  int32_t kvh[64], *kvd = NULL;
  const int64_t kshape[1] = {B};
  fusedk_tensor kv_h = fusedk_tensor_cpu(kvh, FUSEDK_I32, 1, (int64_t *)kshape), kv_d = kv_h;
  if (kv) {
    for (int64_t b = 0; b < B && b < 64; ++b) kvh[b] = (int32_t)(b % 4 == 0 ? Sk : b % 4 == 1 ? 0 : b % 4 == 2 ? Sk / 2 : 1);
    CK(cudaMalloc((void **)&kvd, (size_t)B * 4));
    CK(cudaMemcpy(kvd, kvh, (size_t)B * 4, cudaMemcpyHostToDevice));
    kv_d.data = kvd, kv_d.device.device_type = FUSEDK_DEVICE_CUDA;
  }
  char what[200];
  snprintf(what, sizeof what, "attention_int8_scaled %s B%lld Sq%lld Sk%lld Hq%lld G%lld Dh%lld%s%s scale %g%s",
           sname(s), (long long)B, (long long)Sq, (long long)Sk, (long long)Hq, (long long)G, (long long)Dh,
           causal ? " causal" : "", kv ? " kv_len" : "", (double)scale,
           mode == 1 ? " misaligned q.data" : mode == 2 ? " negative scales" : "");
  ++checks;
  const fusedk_scaled_tensor qh = {&q8.th, &qs.th}, kh = {&k8.th, &ks.th}, qd = {&q8.td, &qs.td}, kd = {&k8.td, &ks.td};
  fusedk_status sc = fusedk_attention_int8_scaled(&out.th, &lse.th, &qh, &kh, &v.th, kv ? &kv_h : NULL, scale, causal,
                                                  NULL);
  fusedk_status sg = fusedk_attention_int8_scaled(&out.td, &lse.td, &qd, &kd, &v.td, kv ? &kv_d : NULL, scale, causal,
                                                  NULL);
  int bad = 0;
  if (misalign) { /* the refusal, by name, and nothing written */
    bad = sc != FUSEDK_OK || sg != FUSEDK_ERR_LAYOUT || !strstr(fusedk_failure_reason(), "q has base");
    if (bad) printf("FAIL %s: CPU %s, GPU %s (%s), expected the GPU's layout refusal\n", what, fusedk_status_name(sc),
                    fusedk_status_name(sg), fusedk_failure_reason());
  } else if (sg == FUSEDK_ERR_UNSUPPORTED && strstr(fusedk_failure_reason(), "sm_90a")) {
    printf("SKIPPED %s: %s\n", what, fusedk_failure_reason()), --checks;
  } else if (!(bad = call_failed(what, sc, sg))) {
    double qmax = 0, kmax = 0;
    for (int64_t i = 0, n = view_count(&q8); i < n; ++i)
      qmax = fmax(qmax, fabs(get(q8.h, view_at(&q8, i), FUSEDK_I8) * get(qs.h, view_at(&qs, i / Dh), FUSEDK_F32)));
    for (int64_t i = 0, n = view_count(&k8); i < n; ++i)
      kmax = fmax(kmax, fabs(get(k8.h, view_at(&k8, i), FUSEDK_I8) * get(ks.h, view_at(&ks, i / Dh), FUSEDK_F32)));
    const double sc_ = scale != 0.0f ? fabs(scale) : 1.0 / sqrt((double)Dh);
    buf_t ao = mk_const(&out, max_abs(&v)), al = mk_const(&lse, sc_ * (double)Dh * qmax * kmax);
    bad += compare(what, &out, &ao, 0, eps_of(s), 1);
    bad += compare(what, &lse, &al, 0, 0x1p-18, 1);
    drop(&ao), drop(&al);
    if (bad) printf("FAIL %s\n", what);
  }
  failures += bad != 0;
  if (kvd) CK(cudaFree(kvd));
  drop(&q8), drop(&qs), drop(&k8), drop(&ks), drop(&v), drop(&out), drop(&lse);
}
static void attn_scaled_cases(fusedk_scalar s) {
  static const int64_t dh[3] = {128, 64, 256};
  for (int d = 0; d < 3; ++d) {
    for (int causal = 0; causal < 2; ++causal) {
      run_attn_scaled(s, 2, 127, 200, 4, 2, dh[d], causal, 0, 0.0f, 0);
      run_attn_scaled(s, 6, 33, 300, 2, 1, dh[d], causal, 1, 0.0f, 0);
    }
    run_attn_scaled(s, 1, 64, 300, 2, 1, dh[d], 0, 0, -0.3f, 0);
  }
  run_attn_scaled(s, 3, 1, 1, 2, 1, 128, 1, 0, 0.0f, 0);
  run_attn_scaled(s, 2, 5, 0, 2, 1, 128, 0, 0, 0.0f, 0); /* no key: 0, lse -inf */
  run_attn_scaled(s, 2, 0, 9, 2, 1, 128, 0, 0, 0.0f, 0); /* no query */
  run_attn_scaled(s, 1, 17, 40, 2, 1, 128, 0, 0, 0.0f, 1);
  run_attn_scaled(s, 2, 70, 150, 2, 1, 64, 1, 0, 0.0f, 2);
  if (small) return;
  run_attn_scaled(s, 1, 130, 2500, 24, 4, 128, 0, 0, 0.0f, 0); /* the split */
  run_attn_scaled(s, 1, 100, 9000, 2, 1, 256, 1, 0, 0.0f, 0);
}

/* A tensor of more than 2^31 elements: the device copy is a random block tiled across it; the
   reference runs on rows sampled from the start, the middle and the end. */
static void run_huge(int silu) { /* rmsnorm, or act(silu) */
  const fusedk_scalar s = FUSEDK_BF16;
  const int64_t D = 1024, rows = ((int64_t)1 << 31) / D + 4099; /* 2^31 + 4099*1024 elements */
  const size_t n = (size_t)(rows * D), bytes = n * 2, blk = 33554467; /* a prime: rows differ */
  size_t free_b = 0, total = 0;
  CK(cudaMemGetInfo(&free_b, &total));
  ++checks;
  if (free_b < 2 * bytes + (1u << 30)) {
    printf("SKIPPED huge case: %zu MB free\n", free_b >> 20);
    --checks;
    return;
  }
  uint16_t *hb = malloc(blk * 2);
  for (size_t i = 0; i < blk; ++i) hb[i] = f32_to_bf16((float)nrand());
  uint16_t *dx, *dy;
  CK(cudaMalloc((void **)&dx, bytes));
  CK(cudaMalloc((void **)&dy, bytes));
  for (size_t o = 0; o < n; o += blk) CK(cudaMemcpy(dx + o, hb, (n - o < blk ? n - o : blk) * 2, cudaMemcpyHostToDevice));
  CK(cudaMemset(dy, 0xff, bytes));
  int64_t shape[2] = {rows, D};
  fusedk_tensor tx = fusedk_tensor_cuda(dx, s, 2, shape, 0), ty = fusedk_tensor_cuda(dy, s, 2, shape, 0);
  fusedk_status st = silu ? fusedk_act(&ty, &tx, FUSEDK_ACT_SILU, NULL) : fusedk_rmsnorm(&ty, NULL, &tx, NULL, NULL, 1e-6f, NULL);
  CK(cudaDeviceSynchronize());
  int bad = st != FUSEDK_OK;
  int64_t sample[6] = {0, 1, rows / 2, ((int64_t)1 << 31) / D, rows - 2, rows - 1};
  uint16_t hx[1024], hy[1024], ry[1024];
  int64_t rshape[2] = {1, D};
  for (int k = 0; k < 6 && !bad; ++k) {
    CK(cudaMemcpy(hx, dx + sample[k] * D, D * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hy, dy + sample[k] * D, D * 2, cudaMemcpyDeviceToHost));
    fusedk_tensor rx = fusedk_tensor_cpu(hx, s, 2, rshape), rr = fusedk_tensor_cpu(ry, s, 2, rshape);
    if (silu) fusedk_act(&rr, &rx, FUSEDK_ACT_SILU, NULL);
    else fusedk_rmsnorm(&rr, NULL, &rx, NULL, NULL, 1e-6f, NULL);
    for (int64_t d = 0; d < D; ++d) {
      double a = bf16_to_f32(hy[d]), b = bf16_to_f32(ry[d]);
      if (!(fabs(a - b) <= 0x1p-7 * fabs(b) + 1e-5)) {
        printf("  huge: row %lld d %lld gpu %g cpu %g\n", (long long)sample[k], (long long)d, a, b);
        bad = 1;
        break;
      }
    }
  }
  printf("%s huge %s bf16 [%lld, %lld] = %zu elements (> 2^31)\n", bad ? "FAIL" : "ok  ", silu ? "act(silu)" : "rmsnorm",
         (long long)rows, (long long)D, n);
  failures += bad;
  CK(cudaFree(dx));
  CK(cudaFree(dy));
  free(hb);
}

/* The op captured into a CUDA graph on a created stream and replayed. */
static void run_graph(void) {
  int64_t shape[2] = {333, 3072}, wsh[1] = {3072};
  buf_t x = mk(FUSEDK_BF16, 2, shape, 0, 0, 0, 1, 0), y = mk(FUSEDK_BF16, 2, shape, 0, 0, 0, 1, 0);
  buf_t w = mk(FUSEDK_BF16, 1, wsh, 0, 0, 0, 0.2, 1);
  poison(&y);
  cudaStream_t s;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  fusedk_status st = fusedk_rmsnorm(&y.td, NULL, &x.td, NULL, &w.td, 1e-6f, (struct CUstream_st *)s);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  fusedk_rmsnorm(&y.th, NULL, &x.th, NULL, &w.th, 1e-6f, NULL);
  ++checks;
  int bad = st != FUSEDK_OK || compare("graph", &y, NULL, 0, eps_of(FUSEDK_BF16), 1);
  printf("%s rmsnorm captured in a CUDA graph on a non-blocking stream\n", bad ? "FAIL" : "ok  ");
  failures += bad;
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(s));
  drop(&x), drop(&y), drop(&w);
}

/* --- the suite: units of cases by family, each unit one dtype or one group ------------------- */

/* [norm] D sweep: sub-warp groups, one warp, blocks, NV = 1..8, scalar path (odd D), re-read
   path; 8192 and 16384: shared-memory caches at and past the 48 KB opt-in limit; layernorm's
   rows in registers up to 16 vectors a thread (65536 f16/bf16), re-read beyond */
static void norm_sweep(fusedk_scalar s) {
  const int64_t Ds[] = {1,    2,    7,    8,    64,    111,   128,   1000,   1152,  2048,
                        3072, 3584, 5120, 8192, 16384, 24576, 65536, 100000, 262144};
  for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; ++di) {
    const int64_t D = Ds[di], L = D >= 16384 ? 3 : D >= 3072 ? 19 : small ? 67 : 989;
    if (small && D > 16384) continue;
    const int n_before = failures;
    case_t c = {.op = RMS, .s = s, .B = 1, .L = L, .D = D, .weight = 1};
    run_case(&c);
    c.weight = 0, c.residual = 1, c.B = 2; /* fused residual, 3-d rows */
    run_case(&c);
    c = (case_t){.op = LN, .s = s, .B = 1, .L = L, .D = D, .weight = 1, .bias = 1};
    run_case(&c);
    c.weight = 0, c.bias = 0, c.pad = 8; /* strided rows, vector path kept */
    run_case(&c);
    c.pad = 3, c.shift = 1; /* misaligned rows: scalar path */
    run_case(&c);
    if (failures == n_before)
      printf("ok   %s D=%lld (rmsnorm, +residual, layernorm, strided, misaligned)\n", sname(s), (long long)D);
  }
}

/* LayerNorm rows whose mean is far from zero (against their sd) take the second statistics pass;
   the rows beside them (same warp or block) do not: sub-warp groups (16, 64), two rows of 64
   threads a block (512, f16/bf16), a block a row (1000, 3072), 16 vectors a thread (24576
   f16/bf16, 65536), rows re-read from L2 (262144; f32 65536), the scalar path (shift); at 26
   rows these are one wave (adaln: scale and shift uncached); adaln's cached and staged rows
   are in adaln_modes; in f32 also rows of mean 1000, sd 0.01, every row through the second pass
   (the epilogue centred on the corrected mean) */
static void norm_far_mean(fusedk_scalar s) {
  const int n_before = failures;
  const int64_t oD[] = {16, 64, 512, 1000, 3072, 24576, 65536, 262144};
  for (size_t di = 0; di < sizeof oD / sizeof oD[0] - (small ? 2 : 0); ++di)
    for (int op = LN; op <= ADALN_LN; ++op)
      for (int sp = 2; sp <= (s == FUSEDK_F32 ? 3 : 2); ++sp) {
        case_t c = {.op = (op_t)op, .s = s, .B = 2, .L = 13, .D = oD[di], .weight = 1, .bias = 1, .special = sp};
        run_case(&c);
        c.shift = 1, c.pad = 3;
        run_case(&c);
      }
  if (failures == n_before) printf("ok   %s layernorm, adaln(layer): rows with a mean far from zero\n", sname(s));
}

/* adaln's launch modes (f16/bf16 rows, H100's 132 SMs): one wave of rows (rows x D/8 <= SMs x
   2048) with scale and shift uncached ([2,77,1152], [2,5,65536]); more rows cached with them,
   in registers at 2 and 4 vectors a thread ([4,600,1152], [3,256,3072]) or staged
   ([2,67,24576]); each also with rows far from zero (second statistics pass). f32 rows of 65536
   and 24576 are re-read from L2. RMS rows (adaln(rms), Mochi): one wave of rows of 256 vectors,
   a block of 256 threads a row, its sums through a whole-warp butterfly over 8 slots
   ([2,64,2048]); sub-warp rows, 32 a block ([2,64,64]; [1,3,64]: 29 dead rows); two rows of 64
   threads a block ([2,32,512]); the rows of a block crossing samples ([3,10,40]). adaln_mod32: a
   float32 scale and shift beside f16/bf16 rows (Wan keeps its modulation float32), adaln alone,
   in those launch modes (one wave uncached, register-cached, staged, L2 re-read, sub-warp rows). */
static void adaln_shape(fusedk_scalar s, const int64_t *BLD, int mod32) {
  for (int op = ADALN_LN; op <= (mod32 ? ADALN_RMS : MOCHI_EXACT); ++op) {
    const case_t base = {.op = (op_t)op, .s = s, .B = BLD[0], .L = BLD[1], .D = BLD[2], .weight = op == ADALN_LN,
                         .bias = op == ADALN_LN, .mod32 = mod32};
    case_t c = base;
    run_case(&c);
    c.vec_stride = 1, c.weight = 0, c.bias = 0, c.pad = 8; /* modulation views, strided rows */
    run_case(&c);
    c.vec_stride = 0, c.vec_broadcast = 1, c.pad = 0, c.shift = 3; /* broadcast vectors, scalar path */
    run_case(&c);
    if (op == ADALN_LN) c = base, c.special = 2, run_case(&c); /* the second statistics pass here */
  }
}
static void adaln_modes(fusedk_scalar s) {
  const int64_t ad[][3] = {{2, 77, 1152}, {3, 256, 3072}, {1, 1, 64},  {2, 19, 111}, {2, 5, 65536}, {4, 600, 1152},
                           {2, 67, 24576}, {2, 64, 2048}, {2, 64, 64}, {1, 3, 64},   {2, 32, 512},  {3, 10, 40}};
  for (size_t k = 0; k < sizeof ad / sizeof ad[0]; ++k) {
    const int n_before = failures;
    adaln_shape(s, ad[k], 0);
    if (failures == n_before)
      printf("ok   %s [%lld,%lld,%lld] adaln(layer/rms), mochi(exact 0/1): plain, modulation views, broadcast\n",
             sname(s), (long long)ad[k][0], (long long)ad[k][1], (long long)ad[k][2]);
  }
}
static void adaln_mod32(fusedk_scalar s) {
  const int64_t md[][3] = {{2, 77, 1152}, {3, 256, 3072}, {1, 1, 64}, {2, 19, 111}, {2, 5, 65536},
                           {4, 600, 1152}, {2, 67, 24576}, {2, 64, 2048}, {3, 10, 40}};
  const int n_before = failures;
  for (size_t k = 0; k < sizeof md / sizeof md[0]; ++k) adaln_shape(s, md[k], 1);
  if (failures == n_before)
    printf("ok   %s adaln(layer/rms) with a float32 scale and shift: every launch mode, views, broadcast\n", sname(s));
}

/* millions of rows, one row, in place, NaN/Inf rows */
static void norm_rows(fusedk_scalar s) {
  (void)s;
  const int n_before = failures;
  const case_t rows[] = {
      {.op = RMS, .s = FUSEDK_BF16, .B = 1, .L = small ? 1 << 12 : 1 << 21, .D = 64, .weight = 1},
      {.op = LN, .s = FUSEDK_F16, .B = 1, .L = 1, .D = 5120, .weight = 1, .bias = 1},
      {.op = RMS, .s = FUSEDK_BF16, .B = 2, .L = 300, .D = 3072, .weight = 1, .inplace = 1},
      {.op = MOCHI_EXACT, .s = FUSEDK_BF16, .B = 2, .L = 300, .D = 3072, .inplace = 1},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; ++i) run_case(&rows[i]);
  for (int op = RMS; op <= MOCHI_EXACT; ++op) {
    const case_t sp = {.op = (op_t)op, .s = FUSEDK_BF16, .B = 2, .L = 7, .D = 3072, .weight = 1,
                       .bias = op == LN || op == ADALN_LN, .special = 1};
    run_case(&sp);
  }
  if (failures == n_before) printf("ok   2M rows, 1 row, in place, NaN/Inf rows\n");
}

/* [elementwise]: D from 1 to 65536 (vector and scalar paths, sub-row groups), strided and
   misaligned rows, modulation-view and broadcast gates, in place, NaN/Inf. Compact tensors run
   as one row; the strided ones keep their rows: at D = 400 (f16/bf16, one vector a thread) a
   row is 64 threads, two rows a block. A per-sample operand broadcast over B next to compact
   tensors (ddim's prev, the gate) keeps the rows too. */
static const int64_t eD[] = {1, 7, 8, 64, 111, 400, 1152, 3072, 65536};
static void ew_sweep(fusedk_scalar s) {
  for (size_t di = 0; di < sizeof eD / sizeof eD[0]; ++di) {
    if (small && eD[di] > 3072) continue;
    const int n_before = failures;
    for (int op = GELU; op <= STEP_DDIM; ++op) {
      const int64_t D = eD[di], L = D >= 16384 ? 3 : 37;
      case_t c = {.op = (op_t)op, .s = s, .B = 2, .L = L, .D = D};
      run_case(&c);
      c.pad = 8, c.vec_stride = 1; /* strided rows, the gate a modulation view */
      run_case(&c);
      c.pad = 3, c.shift = 1, c.vec_stride = 0, c.vec_broadcast = 1; /* misaligned: scalar path */
      run_case(&c);
      c.pad = 0, c.shift = 0, c.vec_broadcast = 0, c.special = 1;
      c.inplace = op != SWIGLU && op != GEGLU; /* glu's y is half of x: never in place */
      run_case(&c);
      if (op == STEP_DDIM || op == GATED_RES) { /* compact, with one operand broadcast over B */
        c.special = 0, c.inplace = 0, c.vec_broadcast = 1;
        run_case(&c);
      }
    }
    if (failures == n_before)
      printf("ok   %s D=%lld act(gelu/gelu_tanh/silu/relu), silu_fma, gated_residual, glu, glu_pair, "
             "diffusion_step(euler/ddim): plain, strided, misaligned, in place + NaN/Inf\n", sname(s),
             (long long)eD[di]);
  }
}

/* gated_residual with a float32 gate beside f16/bf16 rows: vector and scalar paths, views,
   broadcast, in place */
static void ew_gate32(fusedk_scalar s) {
  const int n_before = failures;
  for (size_t di = 0; di < sizeof eD / sizeof eD[0]; ++di) {
    case_t c = {.op = GATED_RES, .s = s, .B = 2, .L = eD[di] >= 16384 ? 3 : 37, .D = eD[di], .mod32 = 1};
    run_case(&c);
    c.pad = 8, c.vec_stride = 1;
    run_case(&c);
    c.pad = 3, c.shift = 1, c.vec_stride = 0, c.vec_broadcast = 1;
    run_case(&c);
    c.pad = 0, c.shift = 0, c.vec_broadcast = 0, c.inplace = 1;
    run_case(&c);
  }
  if (failures == n_before)
    printf("ok   %s gated_residual with a float32 gate: D 1..65536, views, broadcast, misaligned, in place\n",
           sname(s));
}

/* 2M rows (gated_residual: rows over 2048 samples) and 1 row, for the ops first..last */
static void ew_rows(int first, int last) {
  const int n_before = failures;
  for (int op = first; op <= last; ++op) {
    case_t many = {.op = (op_t)op, .s = FUSEDK_BF16, .B = 1, .L = small ? 1 << 12 : 1 << 21, .D = 64};
    if (op == GATED_RES) many.B = small ? 64 : 1 << 11, many.L = small ? 64 : 1 << 10;
    run_case(&many);
    const case_t one = {.op = (op_t)op, .s = FUSEDK_F16, .B = 1, .L = 1, .D = 5120};
    run_case(&one);
  }
  if (failures == n_before) printf("ok   %s..%s: 2M rows, 1 row\n", op_name[first], op_name[last]);
}

/* [position] rope: both styles, GQA, partial rotary, each table layout, strided heads, misaligned
   (scalar path), in place */
static void rope_cases(fusedk_scalar s) {
  for (int style = 0; style < 2; ++style) {
    const int n_before = failures;
    const int64_t dims[][2] = {{128, 128}, {64, 32}, {128, 64}, {96, 96}, {6, 4}, {2, 2}};
    for (int d = 0; d < 6; ++d) {
      const rope_t base = {.s = s, .B = 2, .S = 37, .Hq = 4, .Hk = 4, .Dh = dims[d][0], .R = dims[d][1],
                           .style = style};
      for (int tk = 2; tk <= 5; ++tk) {
        rope_t c = base;
        c.tk = tk, c.Hk = tk == 2 ? 2 : 4;
        run_rope(c);
      }
      rope_t c = base;
      c.B = 2, c.S = 19, c.Hq = 3, c.Hk = 1, c.tk = 2, c.pad = 8; /* strided heads */
      run_rope(c);
      c.pad = 3, c.shift = 1; /* misaligned: scalar path */
      run_rope(c);
      c = base, c.B = 1, c.S = 23, c.tk = 3, c.inplace = 1; /* in place */
      run_rope(c);
      c.Hk = 0, c.tk = 4; /* in place, q alone */
      run_rope(c);
    }
    if (failures == n_before)
      printf("ok   %s rope(%s): Dh/R 128/128 64/32 128/64 96/96 6/4 2/2, GQA, every table layout, strided, "
             "misaligned, in place\n", sname(s), style ? "half" : "interleaved");
  }
}

/* qk_norm_rope: every style, norm and layout; weights given and absent, packed qkv views, GQA
   without v, per-head and per-batch tables, strided heads, misaligned (scalar path), in place
   into the packed buffer; Dh 2 to 256, partial rotary */
static void qknr_cases(fusedk_scalar s) {
  for (int style = 0; style < 2; ++style)
    for (int norm = 0; norm < 3; ++norm) {
      const int n_before = failures;
      const int64_t dims[][2] = {{128, 128}, {64, 32}, {96, 96}, {256, 256}, {10, 4}, {2, 2}};
      for (int d = 0; d < 6; ++d)
        for (int layout = 0; layout < 2; ++layout) {
          const int64_t Dh = dims[d][0], R = dims[d][1] == Dh && d ? 0 : dims[d][1]; /* R 0: all of Dh */
          const qknr_t base = {.s = s, .Dh = Dh, .R = R, .style = style, .norm = norm, .layout = layout,
                               .weights = 1, .tk = 2};
          qknr_t c = base;
          c.B = 2, c.S = 37, c.Hq = c.Hk = 4, c.packed = 1;
          run_qknr(c); /* packed qkv, weights */
          c.Hq = 8, c.Hk = 2, c.weights = 0, c.no_v = 1, c.tk = 5, c.packed = 0; /* GQA, no v, [B,S,1,R/2] bcast */
          run_qknr(c);
          c.Hq = c.Hk = 3, c.weights = 1, c.no_v = 0, c.tk = 3; /* per-head tables */
          run_qknr(c);
          c.B = 3, c.S = 11, c.tk = 4, c.pad = 8; /* per-batch tables, strided heads */
          run_qknr(c);
          c = base, c.B = 2, c.S = 19, c.Hq = 3, c.Hk = 1, c.pad = 3, c.shift = 1; /* misaligned */
          run_qknr(c);
          c.Hk = 3, c.packed = 1, c.pad = 1; /* misaligned packed views */
          run_qknr(c);
          if (layout == FUSEDK_LAYOUT_BSHD) { /* in place; qk_norm_rope_int8 */
            c = base, c.B = 2, c.S = 23, c.Hq = c.Hk = 4, c.packed = 1, c.inplace = 1;
            run_qknr(c);
            c = base, c.q8 = 1, c.B = 2, c.S = 37, c.Hq = c.Hk = 4, c.packed = 1; /* packed, weights */
            run_qknr(c);
            c.Hq = 8, c.Hk = 2, c.weights = 0, c.tk = 5, c.packed = 0; /* GQA, broadcast tables */
            run_qknr(c);
            c.Hq = c.Hk = 3, c.weights = 1, c.tk = 3, c.B = 3, c.S = 11, c.pad = 8; /* per-head tables, strided */
            run_qknr(c);
            c = base, c.q8 = 1, c.B = 2, c.S = 19, c.Hq = 3, c.Hk = 1, c.pad = 3, c.shift = 1; /* misaligned */
            run_qknr(c);
          }
        }
      if (failures == n_before)
        printf("ok   %s qk_norm_rope(%s, %s): Dh/R 128/128 64/32 96/96 256/256 10/4 2/2, bhsd/bshd, packed, GQA "
               "no v, per-head/batch tables, strided, misaligned, in place; the same for qk_norm_rope_int8\n",
               sname(s), qk_norm_name(norm),
               style ? "half" : "interleaved");
    }
}

/* qk_norm_rope's large and odd shapes: H*Dh = 8192 over a full-row norm (Dh 128, 256 and 64,
   GQA, both layouts), one token, many batches of few tokens (a block's token steps wrap S: more
   rows than the grid), the bench shape (B2 S4096 H24 Dh128 bf16, bhsd, head norm), 64K tokens */
static void qknr_big(fusedk_scalar s) {
  (void)s;
  const int n_before = failures;
  const qknr_t rows[] = {
      {.s = FUSEDK_BF16, .B = 1, .S = small ? 33 : 333, .Hq = 64, .Hk = 64, .Dh = 128, .norm = FUSEDK_QK_NORM_FULL,
       .layout = FUSEDK_LAYOUT_BHSD, .weights = 1, .tk = 2, .packed = 1},
      {.s = FUSEDK_F16, .B = 1, .S = small ? 17 : 129, .Hq = 32, .Hk = 32, .Dh = 256, .style = 1,
       .norm = FUSEDK_QK_NORM_FULL, .layout = FUSEDK_LAYOUT_BSHD, .weights = 1, .tk = 2, .packed = 1},
      {.s = FUSEDK_F32, .B = 2, .S = small ? 9 : 65, .Hq = 128, .Hk = 8, .Dh = 64, .norm = FUSEDK_QK_NORM_FULL,
       .layout = FUSEDK_LAYOUT_BHSD, .weights = 1, .tk = 2},
      {.s = FUSEDK_BF16, .B = 1, .S = 21, .Hq = 64, .Hk = 64, .Dh = 128, .R = 64, .style = 1,
       .norm = FUSEDK_QK_NORM_FULL, .layout = FUSEDK_LAYOUT_BSHD, .weights = 1, .tk = 2, .packed = 1, .pad = 3,
       .shift = 1},
      {.s = FUSEDK_F16, .B = 1, .S = 1, .Hq = 1, .Hk = 1, .Dh = 64, .style = 1, .norm = FUSEDK_QK_NORM_HEAD,
       .layout = FUSEDK_LAYOUT_BHSD, .weights = 1, .tk = 2, .packed = 1},
      {.s = FUSEDK_BF16, .B = 1, .S = 1, .Hq = 24, .Hk = 24, .Dh = 128, .norm = FUSEDK_QK_NORM_FULL,
       .layout = FUSEDK_LAYOUT_BSHD, .weights = 1, .tk = 2, .packed = 1},
      {.s = FUSEDK_BF16, .B = 397, .S = 5, .Hq = 6, .Hk = 2, .Dh = 64, .norm = FUSEDK_QK_NORM_HEAD,
       .layout = FUSEDK_LAYOUT_BHSD, .weights = 1, .tk = 2},
      {.s = FUSEDK_F16, .B = 211, .S = 3, .Hq = 4, .Hk = 4, .Dh = 128, .style = 1, .norm = FUSEDK_QK_NORM_FULL,
       .layout = FUSEDK_LAYOUT_BSHD, .weights = 1, .tk = 2, .packed = 1},
  };
  const qknr_t large[] = {
      {.s = FUSEDK_BF16, .B = 2, .S = 4096, .Hq = 24, .Hk = 24, .Dh = 128, .norm = FUSEDK_QK_NORM_HEAD,
       .layout = FUSEDK_LAYOUT_BHSD, .weights = 1, .tk = 2, .packed = 1},
      {.s = FUSEDK_BF16, .B = 1, .S = 1 << 16, .Hq = 2, .Hk = 2, .Dh = 64, .style = 1, .norm = FUSEDK_QK_NORM_HEAD,
       .layout = FUSEDK_LAYOUT_BHSD, .weights = 1, .tk = 2, .packed = 1},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; ++i) run_qknr(rows[i]);
  for (size_t i = 0; !small && i < sizeof large / sizeof large[0]; ++i) run_qknr(large[i]);
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; ++i) { /* qk_norm_rope_int8 on the same */
    qknr_t c = rows[i];
    c.q8 = 1;
    run_qknr(c);
  }
  for (size_t i = 0; !small && i < sizeof large / sizeof large[0]; ++i) {
    qknr_t c = large[i];
    c.q8 = 1;
    run_qknr(c);
  }
  if (failures == n_before)
    printf("ok   qk_norm_rope and qk_norm_rope_int8: H*Dh 8192 full norm (Dh 64/128/256, GQA, misaligned), 1 token, "
           "397 x 5 and 211 x 3 tokens%s\n", small ? "" : ", bench shape, 64K tokens");
}

/* rope's bench shape, 64K tokens (GQA), one token, many batches of 3 tokens; the table builders */
static void rope_big(fusedk_scalar s) {
  (void)s;
  const int n_before = failures;
  const rope_t large[] = {
      {.s = FUSEDK_BF16, .B = 2, .S = 4096, .Hq = 24, .Hk = 24, .Dh = 128, .R = 128, .tk = 2},
      {.s = FUSEDK_BF16, .B = 1, .S = 1 << 16, .Hq = 8, .Hk = 2, .Dh = 64, .R = 64, .style = 1, .tk = 2},
  };
  const rope_t rows[] = {
      {.s = FUSEDK_F16, .B = 1, .S = 1, .Hq = 1, .Hk = 1, .Dh = 64, .R = 64, .style = 1, .tk = 2},
      {.s = FUSEDK_F32, .B = 601, .S = 3, .Hq = 4, .Hk = 2, .Dh = 64, .R = 32, .tk = 2},
  };
  for (size_t i = 0; !small && i < sizeof large / sizeof large[0]; ++i) run_rope(large[i]);
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; ++i) run_rope(rows[i]);
  run_tables(small ? 257 : 4097);
  run_tables(1);
  if (failures == n_before)
    printf("ok   rope: bench shape, 1 token, 64K tokens, 601 x 3 tokens; rope_table_1d/axes/ltx/mixed\n");
}

static void graph_unit(fusedk_scalar s) { (void)s, run_graph(); }
static void huge_rmsnorm(fusedk_scalar s) { (void)s, run_huge(0); }
static void huge_silu(fusedk_scalar s) { (void)s, run_huge(1); }

/* [linear]: every act, with and without bias and aux; odd N and K (4095, 1000: no 16-byte rows,
   cuBLASLt's unaligned kernels and fusedk's fallbacks), padded rows, a base off by one element,
   one row, one column, K = 0 (y = act(bias)), a 1-row 2-d x; f32 also through TF32 */
static void linear_cases(fusedk_scalar s) {
  const int n_before = failures;
  for (int act = FUSEDK_ACT_GELU; act <= FUSEDK_ACT_NONE; ++act) {
    run_linear((linear_t){.s = s, .B = 2, .L = 33, .N = 96, .K = 64, .act = act, .bias = 1, .aux = 1});
    run_linear((linear_t){.s = s, .B = 1, .L = 7, .N = 72, .K = 40, .act = act, .aux = act % 2, .pad = 3, .shift = 1});
    if (!small) run_linear((linear_t){.s = s, .B = 1, .L = 17, .N = 4095, .K = 1000, .act = act, .bias = 1, .aux = 1});
  }
  const linear_t rows[] = {
      /* K = 4095: dx, dw rows unaligned */
      {.s = s, .B = 1, .L = 9, .N = 1000, .K = 4095, .act = FUSEDK_ACT_GELU_TANH, .bias = 1, .aux = 1},
      {.s = s, .B = 1, .L = 1, .N = 1, .K = 1, .act = FUSEDK_ACT_RELU, .bias = 1, .aux = 1},
      {.s = s, .B = 3, .L = 5, .N = 8, .K = 0, .act = FUSEDK_ACT_GELU_TANH, .bias = 1, .aux = 1},
      {.s = s, .B = 1, .L = 1, .N = 512, .K = 256, .act = FUSEDK_ACT_SILU, .bias = 1},
      {.s = s, .B = 2, .L = 300, .N = 256, .K = 128, .act = FUSEDK_ACT_GELU_TANH, .bias = 1, .pad = 8},
      {.s = s, .B = 2, .L = 33, .N = 96, .K = 64, .act = FUSEDK_ACT_RELU, .bias = 1, .aux = 1, .tf32 = 1},
  };
  const linear_t large[] = {
      {.s = s, .B = 2, .L = 128, .N = 1152, .K = 1152, .act = FUSEDK_ACT_GELU_TANH, .bias = 1, .aux = 1},
      {.s = s, .B = 1, .L = 17, .N = 4095, .K = 1000, .act = FUSEDK_ACT_GELU_TANH, .bias = 1, .aux = 1, .tf32 = 1},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; ++i)
    if (!rows[i].tf32 || s == FUSEDK_F32) run_linear(rows[i]);
  for (size_t i = 0; !small && i < sizeof large / sizeof large[0]; ++i)
    if (!large[i].tf32 || s == FUSEDK_F32) run_linear(large[i]);
  if (failures == n_before)
    printf("ok   %s linear, linear_backward (5 acts, bias, aux, odd N/K, strided, misaligned)\n", sname(s));
}

/* M = 0 (dw, db zero), N = 0 with a db that has data (dx zero, nothing else written), CUDA-graph
   capture on a fresh stream and fusedk_shutdown */
static void linear_edges(fusedk_scalar s) {
  (void)s;
  run_linear((linear_t){.s = FUSEDK_BF16, .L = 4, .N = 16, .K = 8, .act = FUSEDK_ACT_GELU, .bias = 1, .aux = 1});
  const int64_t xs[2] = {4, 8}, ws[2] = {0, 8}, ys[2] = {4, 0}, zs[1] = {0};
  buf_t x = mk(FUSEDK_F32, 2, xs, 0, 0, 0, 1.0, 0.0), dx = mk(FUSEDK_F32, 2, xs, 0, 0, 0, 0.0, 0.0);
  buf_t w = mk(FUSEDK_F32, 2, ws, 0, 1, 0, 0.0, 0.0), dy = mk(FUSEDK_F32, 2, ys, 0, 1, 0, 0.0, 0.0);
  buf_t db = mk(FUSEDK_F32, 1, zs, 0, 1, 0, 0.0, 0.0); /* shift 1: a real, non-NULL pointer */
  poison(&dx);
  fusedk_status sg = fusedk_linear_backward(&dx.td, NULL, &db.td, &dy.td, &x.td, &w.td, NULL, FUSEDK_ACT_NONE, 0, NULL);
  float h[32];
  CK(cudaMemcpy(h, dx.d, sizeof h, cudaMemcpyDeviceToHost));
  int zero = 1;
  for (int i = 0; i < 32; ++i) zero = zero && h[i] == 0.0f;
  ++checks;
  if (sg || !zero) printf("FAIL linear_backward N = 0: %s, dx zero %d\n", fusedk_status_name(sg), zero), ++failures;
  drop(&x), drop(&dx), drop(&w), drop(&dy), drop(&db);
  const int n_before = failures;
  run_linear_graph();
  if (failures == n_before) printf("ok   linear: CUDA-graph capture on a fresh stream, fusedk_shutdown\n");
}

static void linear_tuned(fusedk_scalar s) {
  (void)s;
  const int n_before = failures;
  run_linear_tuned("2");
  run_linear_tuned("3");
  if (failures == n_before) printf("ok   linear: FUSEDK_LINEAR_TUNE=2 and 3's picks, none, relu, gelu_tanh + aux\n");
}

static void ew_rows_act(fusedk_scalar s) { (void)s, ew_rows(GELU, RELU); }
static void ew_rows_fma(fusedk_scalar s) { (void)s, ew_rows(SILU_FMA, GATED_RES); }
static void ew_rows_glu(fusedk_scalar s) { (void)s, ew_rows(SWIGLU, GLU_PAIR); }
static void ew_rows_step(fusedk_scalar s) { (void)s, ew_rows(STEP_EULER, STEP_DDIM); }

/* every tile width (Dh 64, 128, 256), masks, GQA 1/4/8, Sq != Sk both ways, 1-row and 1-key
   shapes, both layouts and a packed projection, kv_len, lse */
static void attn_cases(fusedk_scalar s) {
  const int64_t dh[3] = {64, 128, 256};
  for (int d = 0; d < 3; ++d)
    for (int causal = 0; causal < 2; ++causal) {
      const int64_t D = dh[d];
      run_attn((attn_t){.s = s, .B = 2, .Sq = 127, .Sk = 127, .Hq = 4, .G = 1, .Dh = D, .causal = causal});
      const int64_t L = small ? 300 : 1000; /* the sanitizers' runs: shorter */
      run_attn((attn_t){.s = s, .B = 1, .Sq = 17, .Sk = L, .Hq = 8, .G = 4, .Dh = D, .causal = causal, .layout = 1});
      run_attn((attn_t){.s = s, .B = 1, .Sq = L, .Sk = 17, .Hq = 8, .G = 8, .Dh = D, .causal = causal});
      run_attn((attn_t){.s = s, .B = 3, .Sq = 1, .Sk = 1, .Hq = 2, .G = 1, .Dh = D, .causal = causal});
      run_attn((attn_t){.s = s, .B = 5, .Sq = 33, .Sk = 200, .Hq = 4, .G = 2, .Dh = D, .causal = causal, .kv = 1});
      run_attn((attn_t){.s = s, .B = 2, .Sq = 129, .Sk = 129, .Hq = 3, .G = 1, .Dh = D, .causal = causal, .layout = 2,
                        .pad = 8});
    }
}

/* head sizes between the tile widths (vector path: multiples of 8), Dh not a multiple of 8 and
   misaligned bases (element path), padded rows, a negative and an explicit scale, huge scores,
   a NaN key, float32 refused on the GPU */
static void attn_edges(fusedk_scalar s) {
  const int64_t dh[6] = {8, 40, 72, 96, 136, 200};
  for (int d = 0; d < 6; ++d)
    run_attn((attn_t){.s = s, .B = 2, .Sq = 70, .Sk = 90, .Hq = 4, .G = 2, .Dh = dh[d], .causal = d % 2});
  run_attn((attn_t){.s = s, .B = 2, .Sq = 65, .Sk = 65, .Hq = 2, .G = 1, .Dh = 36, .causal = 1});
  run_attn((attn_t){.s = s, .B = 2, .Sq = 65, .Sk = 80, .Hq = 2, .G = 2, .Dh = 128, .shift = 1, .kv = 1});
  run_attn((attn_t){.s = s, .B = 1, .Sq = 100, .Sk = 300, .Hq = 2, .G = 1, .Dh = 64, .pad = 3, .layout = 1});
  run_attn((attn_t){.s = s, .B = 1, .Sq = 64, .Sk = 64, .Hq = 2, .G = 1, .Dh = 64, .scale = -0.3f});
  run_attn((attn_t){.s = s, .B = 1, .Sq = 64, .Sk = 64, .Hq = 2, .G = 1, .Dh = 128, .scale = 1.0f, .special = 1});
  run_attn((attn_t){.s = s, .B = 2, .Sq = 40, .Sk = 40, .Hq = 4, .G = 2, .Dh = 64, .causal = 1, .special = 2});
  /* fewer units than SMs, each over many key tiles: the Hopper kernel splits every unit by keys
     across blocks (3-6 pieces a unit on 132 SMs), merging them in the launch; with a NaN key and
     huge scores in one piece */
  for (int d = 0; d < 3; ++d)
    run_attn((attn_t){.s = s, .B = 1, .Sq = 130, .Sk = 2500, .Hq = 24, .G = 4, .Dh = 64 << d, .layout = d == 1});
  run_attn((attn_t){.s = s, .B = 1, .Sq = 130, .Sk = 2500, .Hq = 24, .G = 4, .Dh = 128, .special = 1});
  run_attn((attn_t){.s = s, .B = 1, .Sq = 130, .Sk = 2500, .Hq = 24, .G = 4, .Dh = 128, .special = 2});
  /* more causal / kv_len units than SMs: the Hopper kernel's blocks take them from a counter */
  run_attn((attn_t){.s = s, .B = 2, .Sq = 130, .Sk = 300, .Hq = 70, .G = 7, .Dh = 128, .causal = 1});
  run_attn((attn_t){.s = s, .B = 5, .Sq = 100, .Sk = 300, .Hq = 30, .G = 3, .Dh = 64, .kv = 1, .layout = 1});
  /* float32 on the GPU: UNSUPPORTED, named, nothing written */
  const int64_t shp[4] = {1, 4, 1, 64};
  buf_t q = mk(FUSEDK_F32, 4, shp, 0, 0, 0, 1.0, 0.0), o = mk(FUSEDK_F32, 4, shp, 0, 0, 0, 0.0, 0.0);
  poison(&o);
  fusedk_status st = fusedk_attention(&o.td, NULL, &q.td, &q.td, &q.td, NULL, 0.0f, 0, NULL);
  float h;
  CK(cudaMemcpy(&h, o.d, 4, cudaMemcpyDeviceToHost));
  ++checks;
  if (st != FUSEDK_ERR_UNSUPPORTED || !isnan(h) || !strstr(fusedk_failure_reason(), "float32"))
    printf("FAIL attention float32 on the GPU: %s (%s), out %s\n", fusedk_status_name(st), fusedk_failure_reason(),
           isnan(h) ? "untouched" : "written"), ++failures;
  drop(&q), drop(&o);
}

/* long sequences: 4097 keys (tiles past a block's rows, a 1-key tail), causal and not, GQA; more
   units (64-192-row blocks of a head) than SMs, so that the Hopper kernel's persistent blocks
   take several, the K/V ring running on across them: the last wave's units split by keys, and
   causal / kv_len units from a counter */
static void attn_big(fusedk_scalar s) {
  if (small) return;
  run_attn((attn_t){.s = s, .B = 4, .Sq = 300, .Sk = 300, .Hq = 40, .G = 4, .Dh = 128});
  run_attn((attn_t){.s = s, .B = 1, .Sq = 1000, .Sk = 1000, .Hq = 20, .G = 1, .Dh = 256});
  run_attn((attn_t){.s = s, .B = 4, .Sq = 300, .Sk = 300, .Hq = 40, .G = 4, .Dh = 128, .causal = 1});
  run_attn((attn_t){.s = s, .B = 5, .Sq = 300, .Sk = 350, .Hq = 32, .G = 8, .Dh = 256, .causal = 1, .kv = 1});
  run_attn((attn_t){.s = s, .B = 8, .Sq = 129, .Sk = 520, .Hq = 32, .G = 8, .Dh = 64, .layout = 1});
  for (int causal = 0; causal < 2; ++causal)
    run_attn((attn_t){.s = s, .B = 1, .Sq = 4097, .Sk = 4097, .Hq = 2, .G = 2, .Dh = 128, .causal = causal});
  run_attn((attn_t){.s = s, .B = 1, .Sq = 1000, .Sk = 1000, .Hq = 2, .G = 1, .Dh = 256, .causal = 1});
}

/* attention_int8 (Dh 64, 128 and 256 on the GPU): odd lengths, one key and one query, GQA, causal,
   kv_len (0 and past Sk among them), transposed and packed layouts, misaligned bases, huge
   scores, a K offset per channel (what k's mean takes off), more units than SMs, the tail split,
   33000 keys; each head size (rows of 64 bytes: the 64-byte swizzle; 256: two 128-byte chunks a
   row, tiles of 64 keys) on the cases that touch its layout */
static void attn_i8_cases(fusedk_scalar s) {
  static const int64_t dh[3] = {128, 64, 256};
  for (int d = 0; d < 3; ++d) {
    const int64_t D = dh[d];
    for (int causal = 0; causal < 2; ++causal) {
      run_attn((attn_t){.s = s, .B = 2, .Sq = 127, .Sk = 127, .Hq = 4, .G = 1, .Dh = D, .causal = causal, .int8 = 1});
      run_attn((attn_t){.s = s, .B = 6, .Sq = 33, .Sk = 200, .Hq = 4, .G = 2, .Dh = D, .causal = causal, .kv = 1,
                        .int8 = 1});
      run_attn((attn_t){.s = s, .B = 2, .Sq = 129, .Sk = 129, .Hq = 3, .G = 1, .Dh = D, .causal = causal, .layout = 2,
                        .pad = 8, .int8 = 1});
    }
    run_attn((attn_t){.s = s, .B = 1, .Sq = 64, .Sk = 300, .Hq = 2, .G = 1, .Dh = D, .scale = -0.3f, .shift = 1,
                      .int8 = 1});
  }
  for (int causal = 0; causal < 2; ++causal) {
    run_attn((attn_t){.s = s, .B = 1, .Sq = 17, .Sk = small ? 300 : 1000, .Hq = 8, .G = 4, .Dh = 128, .causal = causal,
                      .layout = 1, .int8 = 1});
    run_attn((attn_t){.s = s, .B = 3, .Sq = 1, .Sk = 1, .Hq = 2, .G = 1, .Dh = 128, .causal = causal, .int8 = 1});
  }
  run_attn((attn_t){.s = s, .B = 2, .Sq = 65, .Sk = 80, .Hq = 2, .G = 2, .Dh = 128, .shift = 1, .kv = 1, .int8 = 1});
  run_attn((attn_t){.s = s, .B = 1, .Sq = 64, .Sk = 64, .Hq = 2, .G = 1, .Dh = 128, .scale = 1.0f, .special = 1,
                    .int8 = 1});
  run_attn((attn_t){.s = s, .B = 1, .Sq = 64, .Sk = 300, .Hq = 2, .G = 1, .Dh = 128, .scale = -0.3f, .int8 = 1});
  run_attn((attn_t){.s = s, .B = 2, .Sq = 200, .Sk = 300, .Hq = 2, .G = 1, .Dh = 128, .special = 3, .int8 = 1});
  run_attn((attn_t){.s = s, .B = 2, .Sq = 200, .Sk = 300, .Hq = 2, .G = 1, .Dh = 256, .special = 3, .int8 = 1});
  if (small) return;
  run_attn((attn_t){.s = s, .B = 2, .Sq = 130, .Sk = 300, .Hq = 70, .G = 7, .Dh = 128, .causal = 1, .int8 = 1});
  for (int d = 0; d < 3; ++d) {
    run_attn((attn_t){.s = s, .B = 1, .Sq = 130, .Sk = 2500, .Hq = 24, .G = 4, .Dh = dh[d], .int8 = 1}); /* the split */
    run_attn((attn_t){.s = s, .B = 1, .Sq = 100, .Sk = 33000, .Hq = 1, .G = 1, .Dh = dh[d], .int8 = 1});
  }
  run_attn((attn_t){.s = s, .B = 2, .Sq = 300, .Sk = 700, .Hq = 70, .G = 7, .Dh = 64, .causal = 1, .kv = 1, .int8 = 1});
  run_attn((attn_t){.s = s, .B = 2, .Sq = 300, .Sk = 700, .Hq = 16, .G = 2, .Dh = 256, .causal = 1, .kv = 1,
                    .int8 = 1});
}

/* --- [lowrank] lowrank_update against the CPU reference ----------------------------------------
   Tolerance: eps_T |cpu| (the output's rounding) + (e_h + 2^-19) S, with S the reference run on
   absolute values (|beta| |y| + |scaling| sum_j |x v|_j |codes| |u_t|): float32 accumulation
   against double, and on the tensor-core path (16-bit) h rounded once to the dtype (e_h = eps_T;
   float32 keeps h in float32: e_h = 0). */
typedef struct {
  fusedk_scalar s;
  int64_t B, L, K1, r, K2; /* x [B, L, K1], v [K1, r], u_t [r, K2] */
  int codes, y, inplace, nan_y; /* codes given; y given; out is y; y all NaN (with beta 0: ignored) */
  float scaling, beta;
  int64_t pad;  /* row padding of x, codes, y, out (and u_t) */
  size_t shift; /* leading elements of x, y, out: misaligned bases */
} lowrank_t;

static void run_lowrank(lowrank_t c) {
  const fusedk_scalar s = c.s;
  const int64_t xs[3] = {c.B, c.L, c.K1}, vs[2] = {c.K1, c.r}, cs[3] = {c.B, c.L, c.r}, us[2] = {c.r, c.K2},
                ys[3] = {c.B, c.L, c.K2};
  char what[200];
  snprintf(what, sizeof what, "lowrank_update %s [%lld,%lld,%lld] r=%lld K2=%lld%s%s%s scaling %g beta %g pad %lld "
           "shift %zu", sname(s), (long long)c.B, (long long)c.L, (long long)c.K1, (long long)c.r, (long long)c.K2,
           c.codes ? " codes" : "", c.y ? (c.nan_y ? " y(NaN)" : " y") : "", c.inplace ? " in-place" : "",
           (double)c.scaling, (double)c.beta, (long long)c.pad, c.shift);
  buf_t x = mk(s, 3, xs, c.pad, c.shift, 0, 1.0, 0.0), v = mk(s, 2, vs, 0, 0, 0, 1.0 / sqrt((double)(c.K1 ? c.K1 : 1)), 0.0);
  buf_t cd = mk(s, 3, cs, c.pad, 0, 0, 1.0, 0.0), u = mk(s, 2, us, c.pad, 0, 0, 1.0, 0.0);
  buf_t y = mk(s, 3, ys, c.pad, c.shift, 0, 1.0, 0.0), o = {0};
  if (c.nan_y) poison(&y);
  /* the bound's inputs, before an in-place call overwrites y */
  buf_t xa = lin_abs(&x, 1.0), va = lin_abs(&v, 1.0), ca = lin_abs(&cd, 1.0), ua = lin_abs(&u, 1.0), ya = lin_abs(&y, 1.0);
  buf_t *out = &y;
  if (!c.inplace) o = mk(s, 3, ys, c.pad, c.shift, 0, 0.0, 0.0), poison(&o), out = &o;
  buf_t sb = lin_abs(out, 0.0);
  fusedk_status sc = fusedk_lowrank_update(&out->th, &x.th, &v.th, c.codes ? &cd.th : NULL, &u.th, c.y ? &y.th : NULL,
                                           c.scaling, c.beta, NULL);
  fusedk_status sg = fusedk_lowrank_update(&out->td, &x.td, &v.td, c.codes ? &cd.td : NULL, &u.td, c.y ? &y.td : NULL,
                                           c.scaling, c.beta, NULL);
  if (!call_failed_counted(what, sc, sg)) {
    fusedk_lowrank_update(&sb.th, &xa.th, &va.th, c.codes ? &ca.th : NULL, &ua.th, c.y && c.beta != 0.f ? &ya.th : NULL,
                          fabsf(c.scaling), fabsf(c.beta), NULL);
    const double e = eps_of(s), eh = s == FUSEDK_F32 ? 0.0 : e;
    void *g = to_host(out);
    int bad = 0;
    for (int64_t i = 0, n = view_count(out); i < n; ++i) {
      const size_t k = view_at(out, i);
      const double cpu = get(out->h, k, s), gpu = get(g, k, s), t = e * fabs(cpu) + (eh + 0x1p-19) * get(sb.h, k, s) + 1e-6;
      if (!(fabs(gpu - cpu) <= t) && bad++ < 3)
        printf("FAIL %s: element %lld gpu %.6g cpu %.6g tol %.3g\n", what, (long long)i, gpu, cpu, t);
    }
    unsigned char *inview = view_mask(out);
    bad += outside_written("FAIL ", what, out, inview, g, out->h);
    free(inview), free(g);
    ++checks;
    if (bad) ++failures;
  }
  free(xa.h), free(va.h), free(ca.h), free(ua.h), free(ya.h), free(sb.h);
  drop(&x), drop(&v), drop(&cd), drop(&u), drop(&y), drop(&o);
}

/* every rank class (1-16, 32, 64, 128; not a multiple of 8: v's rows element by element), codes
   and y present and absent, in place, beta 0 over a NaN y (ignored), K1 = 0 (out = beta y), one
   row, partial 64-row blocks; odd K1/K2 and misaligned or padded rows (the CUDA-core kernel for
   16-bit too); float32 on CUDA cores */
static void lowrank_cases(fusedk_scalar s) {
  const int n_before = failures;
  const int64_t ranks[] = {1, 7, 8, 16, 24, 64, 100, 128};
  for (size_t i = 0; i < sizeof ranks / sizeof ranks[0]; ++i)
    run_lowrank((lowrank_t){.s = s, .B = 2, .L = 33, .K1 = 200, .r = ranks[i], .K2 = 136, .codes = 1, .y = 1,
                            .scaling = 0.5f, .beta = 1.0f});
  const lowrank_t rows[] = {
      {.s = s, .B = 1, .L = 70, .K1 = 96, .r = 16, .K2 = 72, .scaling = 1.0f, .beta = 1.0f},
      {.s = s, .B = 2, .L = 65, .K1 = 128, .r = 32, .K2 = 64, .codes = 1, .y = 1, .inplace = 1, .scaling = 2.0f,
       .beta = -0.75f},
      {.s = s, .B = 1, .L = 1, .K1 = 8, .r = 8, .K2 = 8, .codes = 1, .y = 1, .scaling = 1.0f, .beta = 1.0f},
      {.s = s, .B = 3, .L = 5, .K1 = 1000, .r = 12, .K2 = 4095, .y = 1, .scaling = 0.25f, .beta = 0.5f},
      {.s = s, .B = 1, .L = 40, .K1 = 64, .r = 64, .K2 = 64, .codes = 1, .y = 1, .scaling = 1.0f, .beta = 1.0f, .pad = 8},
      {.s = s, .B = 1, .L = 40, .K1 = 64, .r = 16, .K2 = 64, .y = 1, .inplace = 1, .scaling = 1.0f, .beta = 1.0f,
       .pad = 3, .shift = 1},
      {.s = s, .B = 2, .L = 10, .K1 = 0, .r = 4, .K2 = 24, .codes = 1, .y = 1, .scaling = 1.0f, .beta = 2.0f},
      {.s = s, .B = 1, .L = 50, .K1 = 72, .r = 128, .K2 = 200, .codes = 1, .y = 1, .nan_y = 1, .scaling = 1.0f},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; ++i) run_lowrank(rows[i]);
  /* more row blocks than SMs (no column splits: several column tiles a block) and more k and
     column tiles than ring stages (the stages refilled), for each rank class, with v's rows
     element by element (r not a multiple of 8) and in place; the sanitizers' runs too */
  const lowrank_t rings[] = {
      {.s = s, .B = 1, .L = 8449, .K1 = 520, .r = 8, .K2 = 456, .codes = 1, .y = 1, .scaling = 1.0f, .beta = 1.0f},
      {.s = s, .B = 1, .L = 8449, .K1 = 320, .r = 20, .K2 = 328, .codes = 1, .y = 1, .scaling = 0.5f, .beta = 1.0f},
      {.s = s, .B = 1, .L = 8449, .K1 = 328, .r = 50, .K2 = 320, .y = 1, .inplace = 1, .scaling = 0.5f, .beta = 1.0f},
      {.s = s, .B = 1, .L = 8449, .K1 = 320, .r = 128, .K2 = 328, .codes = 1, .y = 1, .inplace = 1, .scaling = 0.25f,
       .beta = -1.0f},
  };
  for (size_t i = 0; i < sizeof rings / sizeof rings[0]; ++i) run_lowrank(rings[i]);
  /* row blocks filling at most 3/4 of the SMs: the two passes, h's k splits and out's column
     splits several each, the last row block partial */
  run_lowrank((lowrank_t){.s = s, .B = 1, .L = 4601, .K1 = 1032, .r = 32, .K2 = 1032, .codes = 1, .y = 1,
                          .scaling = 0.5f, .beta = 1.0f});
  /* the same with more column tiles a split than out's ring has stages (refilled), in place over
     padded rows, and at rank 128 without codes */
  run_lowrank((lowrank_t){.s = s, .B = 1, .L = 1000, .K1 = 136, .r = 32, .K2 = 10568, .codes = 1, .y = 1, .inplace = 1,
                          .scaling = 0.5f, .beta = 1.0f, .pad = 8});
  run_lowrank((lowrank_t){.s = s, .B = 1, .L = 500, .K1 = 200, .r = 100, .K2 = 21128, .y = 1, .scaling = 0.5f,
                          .beta = 0.5f});
  if (!small) { /* BEM's shape (seed 001), a rank-128 adapter over many blocks, and row blocks
                   between 3/4 of the SMs and all of them (one pass, split by out's columns) */
    run_lowrank((lowrank_t){.s = s, .B = 1, .L = 7000, .K1 = 136, .r = 16, .K2 = 2056, .codes = 1, .scaling = 1.0f});
    run_lowrank((lowrank_t){.s = s, .B = 1, .L = 16384, .K1 = 768, .r = 8, .K2 = 768, .codes = 1, .y = 1,
                            .scaling = 2.0f, .beta = 1.0f});
    run_lowrank((lowrank_t){.s = s, .B = 3, .L = 1000, .K1 = 1024, .r = 128, .K2 = 1032, .y = 1, .scaling = 0.5f,
                            .beta = 1.0f});
  }
  if (failures == n_before)
    printf("ok   %s lowrank_update (ranks 1-128, codes, y, in place, beta 0, K1 0, odd sizes, strided, misaligned, "
           "one and two passes)\n",
           sname(s));
}

/* --- [lowrank] lowrank_prepare and linear_lowrank against the CPU reference ---------------------
   w_cat prepared on both sides must match bit for bit (scaling b rounded once from double), and
   nothing outside its view written. The GPU's linear_lowrank then runs on the CPU's w_cat. x, a
   and codes hold few-bit values (x k/4, a k/16, codes +-2^j) so that h = (x a^T) * codes is exact
   in float32 and double alike and rounds to the same h on both sides; what is left is the GEMM's
   accumulation order: linear's bound (lin_compare) against the reference on absolute values. */
typedef struct {
  fusedk_scalar s;
  int64_t B, L, K, r, N; /* x [B, L, K], a [r, K], w [N, K], b [N, r] (A > 1: [A, r, K], [A, N, r]) */
  int codes, bias, act;
  float scaling;
  int64_t pad;  /* row padding of x, a, w, w_cat, y */
  size_t shift; /* leading elements of x and y */
  int64_t A;    /* adapters stacked (0: one, 2-d a and b) */
  int ids;      /* adapter_ids: 0 none (every adapter on every row), 1 in runs of 5 rows, -1 and A among them */
  int room;     /* x [B, L, K + A rp]: h written into its last columns, read there by the GEMM */
} lora_t;

/* every element of b to k * step, k an integer rounded from it / step and clamped to +-lim
   (pow2: +-2^j, j in -1..1, instead), copied to the device */
static void few_bits(buf_t *b, double step, double lim, int pow2) {
  for (size_t i = 0; i < b->n_alloc; ++i) {
    const double v = get(b->h, i, b->s), k = fmin(lim, fmax(-lim, nearbyint(v / step)));
    put(b->h, i, pow2 ? (v < 0 ? -1.0 : 1.0) * ldexp(1.0, (int)(i % 3) - 1) : k * step, b->s);
  }
  CK(cudaMemcpy(b->d, b->h, b->n_alloc * esize(b->s), cudaMemcpyHostToDevice));
}

static void run_linear_lowrank(lora_t c) {
  const fusedk_scalar s = c.s;
  const int64_t A = c.A ? c.A : 1, rp = (c.r + 7) / 8 * 8, M = c.B * c.L,
                xs[3] = {c.B, c.L, c.K + (c.room ? A * rp : 0)},
                as[3] = {A, c.r, c.K}, cs[3] = {c.B, c.L, c.r}, ws[2] = {c.N, c.K}, bs[3] = {A, c.N, c.r},
                wcs[2] = {c.N, c.K + A * rp}, ns[1] = {c.N}, ys[3] = {c.B, c.L, c.N};
  const int fd = c.A ? 3 : 2; /* a's and b's ndim */
  char what[220], prep[200];
  snprintf(what, sizeof what, "linear_lowrank %s [%lld,%lld,%lld] r=%lld N=%lld act=%s%s%s scaling %g pad %lld shift %zu "
           "A=%lld%s%s", sname(s), (long long)c.B, (long long)c.L, (long long)c.K, (long long)c.r, (long long)c.N,
           act_name(c.act), c.codes ? " codes" : "", c.bias ? " bias" : "", (double)c.scaling, (long long)c.pad, c.shift,
           (long long)A, c.ids ? " ids" : "", c.room ? " x with room" : "");
  snprintf(prep, sizeof prep, "lowrank_prepare %s N=%lld K=%lld r=%lld pad %lld", sname(s), (long long)c.N,
           (long long)c.K, (long long)c.r, (long long)c.pad);
  buf_t x = mk(s, 3, xs, c.pad, c.shift, 0, 1.0, 0.0), a = mk(s, fd, as + 3 - fd, c.pad, 0, 0, 0.25, 0.0);
  buf_t cd = mk(s, 3, cs, 0, 0, 0, 1.0, 0.0), w = mk(s, 2, ws, c.pad, 0, 0, 1.0 / sqrt((double)c.K), 0.0);
  buf_t b = mk(s, fd, bs + 3 - fd, 0, 0, 0, 1.0 / sqrt((double)c.r), 0.0), bias = mk(s, 1, ns, 0, 0, 0, 0.5, 0.0);
  int32_t *idh = malloc((size_t)M * sizeof(int32_t) + 4), *idd = NULL;
  for (int64_t m = 0; m < M; ++m) idh[m] = (int32_t)((m / 5) % (A + 2)) - 1; /* -1 .. A: none at both ends */
  CK(cudaMalloc((void **)&idd, (size_t)M * sizeof(int32_t) + 4));
  CK(cudaMemcpy(idd, idh, (size_t)M * sizeof(int32_t), cudaMemcpyHostToDevice));
  int64_t ids_shape[1] = {M};
  fusedk_tensor ih = fusedk_tensor_cpu(idh, FUSEDK_I32, 1, ids_shape), idv = ih;
  idv.data = idd, idv.device.device_type = FUSEDK_DEVICE_CUDA;
  buf_t wc = mk(s, 2, wcs, c.pad, 0, 0, 0.0, 0.0), y = mk(s, 3, ys, c.pad, c.shift, 0, 0.0, 0.0);
  buf_t z = mk(s, 3, ys, c.pad, c.shift, 0, 0.0, 0.0);
  few_bits(&x, 0.25, 8, 0), few_bits(&a, 1.0 / 16, 16, 0), few_bits(&cd, 0, 0, 1);
  poison(&wc), poison(&y), poison(&z);
  fusedk_status sc = fusedk_lowrank_prepare(&wc.th, &w.th, &b.th, c.scaling, NULL);
  fusedk_status sg = fusedk_lowrank_prepare(&wc.td, &w.td, &b.td, c.scaling, NULL);
  CK(cudaDeviceSynchronize());
  if (!call_failed_counted(prep, sc, sg)) {
    void *g = to_host(&wc);
    ++checks;
    if (memcmp(g, wc.h, wc.n_alloc * esize(s))) printf("FAIL %s: w_cat differs from the CPU's\n", prep), ++failures;
    free(g);
  }
  CK(cudaMemcpy(wc.d, wc.h, wc.n_alloc * esize(s), cudaMemcpyHostToDevice));
  const fusedk_tensor *bc = c.bias ? &bias.th : NULL, *bg = c.bias ? &bias.td : NULL;
  const fusedk_tensor *ic = c.ids ? &ih : NULL, *ig = c.ids ? &idv : NULL;
  sc = fusedk_linear_lowrank(&y.th, NULL, &x.th, &wc.th, bc, &a.th, c.codes ? &cd.th : NULL, ic, (fusedk_activation)c.act, NULL);
  sg = fusedk_linear_lowrank(&y.td, NULL, &x.td, &wc.td, bg, &a.td, c.codes ? &cd.td : NULL, ig, (fusedk_activation)c.act, NULL);
  CK(cudaDeviceSynchronize());
  if (!call_failed_counted(what, sc, sg)) {
    if (c.room) { /* x's columns as they were, h's the CPU's bits (few-bit inputs: h exact), nothing else written */
      void *g = to_host(&x);
      ++checks;
      if (memcmp(g, x.h, x.n_alloc * esize(s)))
        printf("FAIL %s: x's buffer differs from the CPU's\n", what), ++failures;
      free(g);
    }
    buf_t xa = lin_abs(&x, 1.0), aa = lin_abs(&a, 1.0), ca = lin_abs(&cd, 1.0), wa = lin_abs(&wc, 1.0);
    buf_t ba = lin_abs(&bias, 1.0), s1 = lin_abs(&y, 0.0);
    fusedk_linear_lowrank(&s1.th, NULL, &xa.th, &wa.th, c.bias ? &ba.th : NULL, &aa.th, c.codes ? &ca.th : NULL, ic,
                          FUSEDK_ACT_NONE, NULL);
    const int two_pass = c.act == FUSEDK_ACT_GELU || c.act == FUSEDK_ACT_SILU; /* z rounded, then act */
    if (two_pass) fusedk_linear_lowrank(&z.th, NULL, &x.th, &wc.th, bc, &a.th, c.codes ? &cd.th : NULL, ic, FUSEDK_ACT_NONE, NULL);
    const double g = c.act == FUSEDK_ACT_NONE || c.act == FUSEDK_ACT_RELU ? 1.0 : 1.13;
    lin_compare(what, "", &y, y.h, &s1, g, c.K + c.r, 0, 0, two_pass ? &z : NULL);
    free(xa.h), free(aa.h), free(ca.h), free(wa.h), free(ba.h), free(s1.h);
  }
  drop(&x), drop(&a), drop(&cd), drop(&w), drop(&b), drop(&bias), drop(&wc), drop(&y), drop(&z);
  free(idh);
  CK(cudaFree(idd));
}

/* every rank class (r not a multiple of 8: w_cat's zero columns), codes, bias, every act, K not
   a multiple of 8 (the CUDA-core pass and linear's exact route), odd N, one row, padded and
   misaligned rows; more row blocks than SMs and more k tiles than ring stages; float32 */
static void linear_lowrank_cases(fusedk_scalar s) {
  const int n_before = failures;
  const int64_t ranks[] = {1, 7, 8, 16, 24, 64, 100, 128};
  for (size_t i = 0; i < sizeof ranks / sizeof ranks[0]; ++i)
    run_linear_lowrank((lora_t){.s = s, .B = 2, .L = 33, .K = 200, .r = ranks[i], .N = 136, .codes = i % 2,
                                .bias = 1, .act = FUSEDK_ACT_NONE, .scaling = 0.5f});
  const int acts[] = {FUSEDK_ACT_RELU, FUSEDK_ACT_GELU_TANH, FUSEDK_ACT_GELU, FUSEDK_ACT_SILU};
  for (size_t i = 0; i < 4; ++i)
    run_linear_lowrank((lora_t){.s = s, .B = 1, .L = 70, .K = 256, .r = 16, .N = 192, .codes = 1, .bias = i != 1,
                                .act = acts[i], .scaling = 2.0f});
  const lora_t rows[] = {
      {.s = s, .B = 1, .L = 1, .K = 64, .r = 8, .N = 64, .bias = 1, .act = FUSEDK_ACT_NONE, .scaling = 1.0f},
      {.s = s, .B = 3, .L = 7, .K = 999, .r = 12, .N = 130, .codes = 1, .act = FUSEDK_ACT_NONE, .scaling = 0.25f},
      {.s = s, .B = 1, .L = 40, .K = 128, .r = 32, .N = 4095, .bias = 1, .act = FUSEDK_ACT_GELU_TANH, .scaling = 1.0f},
      {.s = s, .B = 2, .L = 45, .K = 192, .r = 16, .N = 96, .codes = 1, .bias = 1, .act = FUSEDK_ACT_NONE,
       .scaling = -1.5f, .pad = 8},
      {.s = s, .B = 1, .L = 50, .K = 128, .r = 20, .N = 64, .bias = 1, .act = FUSEDK_ACT_RELU, .scaling = 1.0f,
       .pad = 3, .shift = 1},
      {.s = s, .B = 1, .L = 8449, .K = 520, .r = 8, .N = 64, .codes = 1, .bias = 1, .act = FUSEDK_ACT_NONE, .scaling = 1.0f},
      {.s = s, .B = 1, .L = 8449, .K = 328, .r = 128, .N = 72, .bias = 1, .act = FUSEDK_ACT_NONE, .scaling = 0.5f},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; ++i) run_linear_lowrank(rows[i]);
  /* stacked adapters: ids in runs (-1 and A: none), and none (all adapters summed); A rp up to 128;
     r not a multiple of 8 (each slot's zero columns); K not a multiple of 8 */
  const lora_t stacks[] = {
      {.s = s, .B = 2, .L = 33, .K = 200, .r = 16, .N = 136, .codes = 1, .bias = 1, .act = FUSEDK_ACT_NONE,
       .scaling = 0.5f, .A = 4, .ids = 1},
      {.s = s, .B = 2, .L = 33, .K = 200, .r = 16, .N = 136, .bias = 1, .act = FUSEDK_ACT_GELU_TANH, .scaling = 0.5f,
       .A = 4},
      {.s = s, .B = 1, .L = 70, .K = 128, .r = 5, .N = 64, .codes = 1, .act = FUSEDK_ACT_NONE, .scaling = 1.0f, .A = 3,
       .ids = 1},
      {.s = s, .B = 1, .L = 600, .K = 256, .r = 8, .N = 72, .bias = 1, .act = FUSEDK_ACT_RELU, .scaling = 1.0f,
       .A = 16, .ids = 1},
      {.s = s, .B = 3, .L = 7, .K = 999, .r = 12, .N = 130, .codes = 1, .act = FUSEDK_ACT_NONE, .scaling = 0.25f,
       .A = 2, .ids = 1},
      {.s = s, .B = 1, .L = 8449, .K = 328, .r = 32, .N = 64, .bias = 1, .act = FUSEDK_ACT_NONE, .scaling = 0.5f,
       .A = 4, .ids = 1},
      /* few rows, long k: the [x | h] pass splits x's k tiles (4, and 5 uneven ones), then adds the
         splits' sums in order */
      {.s = s, .B = 1, .L = 100, .K = 1024, .r = 24, .N = 64, .codes = 1, .bias = 1, .act = FUSEDK_ACT_NONE,
       .scaling = 1.0f, .A = 2, .ids = 1},
      {.s = s, .B = 1, .L = 130, .K = 1096, .r = 8, .N = 40, .bias = 1, .act = FUSEDK_ACT_RELU, .scaling = 0.5f},
      {.s = s, .B = 1, .L = 20, .K = 0, .r = 8, .N = 24, .bias = 1, .act = FUSEDK_ACT_GELU_TANH, .scaling = 1.0f},
  };
  for (size_t i = 0; i < sizeof stacks / sizeof stacks[0]; ++i) run_linear_lowrank(stacks[i]);
  /* x with room for h: tensor cores, k splits, padded rows, several adapters with ids, K not a
     multiple of 8 (CUDA cores) */
  const lora_t rooms[] = {
      {.s = s, .B = 2, .L = 33, .K = 200, .r = 16, .N = 136, .codes = 1, .bias = 1, .act = FUSEDK_ACT_NONE,
       .scaling = 0.5f, .room = 1},
      {.s = s, .B = 1, .L = 8449, .K = 520, .r = 8, .N = 64, .bias = 1, .act = FUSEDK_ACT_GELU_TANH, .scaling = 1.0f,
       .pad = 8, .room = 1},
      {.s = s, .B = 1, .L = 100, .K = 1024, .r = 24, .N = 64, .codes = 1, .bias = 1, .act = FUSEDK_ACT_NONE,
       .scaling = 1.0f, .A = 2, .ids = 1, .room = 1},
      {.s = s, .B = 3, .L = 7, .K = 999, .r = 12, .N = 130, .codes = 1, .act = FUSEDK_ACT_RELU, .scaling = 0.25f,
       .room = 1},
      {.s = s, .B = 1, .L = 1, .K = 64, .r = 8, .N = 64, .bias = 1, .act = FUSEDK_ACT_NONE, .scaling = 1.0f, .room = 1},
  };
  for (size_t i = 0; i < sizeof rooms / sizeof rooms[0]; ++i) run_linear_lowrank(rooms[i]);
  if (!small) /* a DiT projection's width */
    run_linear_lowrank((lora_t){.s = s, .B = 1, .L = 1024, .K = 1536, .r = 32, .N = 1024, .bias = 1,
                                .act = FUSEDK_ACT_GELU_TANH, .scaling = 1.0f});
  if (failures == n_before)
    printf("ok   %s lowrank_prepare, linear_lowrank (ranks 1-128, codes, bias, acts, odd K and N, strided, misaligned, "
           "stacked adapters with and without ids, k splits, K 0, x with room for h)\n",
           sname(s));
}

/* --- [lowrank] lowrank_update_backward and linear_lowrank_backward against the CPU reference ---
   Random inputs; each gradient within linear's bound (lin_tol) on the reference run on absolute
   values, plus the GPU's roundings of dh = dg * codes and g = scaling h * codes to the dtype
   (grad_rounded: e of the absolute reference each). For linear_lowrank with act the forward's
   aux_out is compared first (few-bit x, a, codes: h exact on both sides), then both backward
   calls take the CPU's aux. dx asked alone must give dx's bits again. */
typedef struct {
  fusedk_scalar s;
  int lora;                 /* 0 lowrank_update_backward, 1 linear_lowrank_backward */
  int64_t B, L, K, r, N, A; /* x [B, L, K], dy [B, L, N]; A adapters (lora; 0: one, 2-d a) */
  int codes, ids, act, gap; /* gap: a's adapters a row apart (a [A, r + 1, K] viewed as [A, r, K]) */
  float scaling;
  int64_t pad;
  size_t shift;
} grad_t;

static void run_lowrank_grad(grad_t c) {
  const fusedk_scalar s = c.s;
  const int lora = c.lora, fd = c.A ? 3 : 2;
  const int64_t A = c.A ? c.A : 1, rp = (c.r + 7) / 8 * 8, M = c.B * c.L, xs[3] = {c.B, c.L, c.K};
  const int64_t ys[3] = {c.B, c.L, c.N}, cs[3] = {c.B, c.L, c.r}, ns[1] = {c.N};
  const int64_t ps[3] = {A, c.r + (c.gap ? 1 : 0), c.K}, vs[2] = {c.K, c.r}, us[2] = {c.r, c.N};
  const int64_t bs[3] = {A, c.N, c.r}, wcs[2] = {c.N, c.K + A * rp};
  char what[240];
  snprintf(what, sizeof what, "%s %s [%lld,%lld,%lld] r=%lld N=%lld A=%lld act=%s%s%s%s scaling %g pad %lld shift %zu",
           lora ? "linear_lowrank_backward" : "lowrank_update_backward", sname(s), (long long)c.B, (long long)c.L,
           (long long)c.K, (long long)c.r, (long long)c.N, (long long)A, act_name(c.act), c.codes ? " codes" : "",
           c.ids ? " ids" : "", c.gap ? " gap" : "", (double)c.scaling, (long long)c.pad, c.shift);
  buf_t x = mk(s, 3, xs, c.pad, c.shift, 0, 1.0, 0.0), dy = mk(s, 3, ys, c.pad, 0, 0, 1.0, 0.0);
  buf_t cd = mk(s, 3, cs, 0, 0, 0, 1.0, 0.0), aux = mk(s, 3, ys, 0, 0, 0, 0.0, 0.0);
  buf_t p = lora ? mk(s, fd, ps + 3 - fd, c.pad, 0, 0, 0.25, 0.0) : mk(s, 2, vs, 0, 0, 0, 0.25, 0.0);
  buf_t q = lora ? mk(s, 2, wcs, c.pad, 0, 0, 1.0 / sqrt((double)c.N), 0.0) : mk(s, 2, us, c.pad, 0, 0, 0.25, 0.0);
  if (c.gap) p.shape[1] = c.r; /* the view: adapter stride (r + 1) K */
  buf_t dx = mk(s, 3, xs, c.pad, c.shift, 0, 0.0, 0.0), dxo = mk(s, 3, xs, c.pad, c.shift, 0, 0.0, 0.0);
  buf_t dp = lora ? mk(s, fd, ps + 3 - fd, 0, 0, 0, 0.0, 0.0) : mk(s, 2, vs, c.pad, 0, 0, 0.0, 0.0);
  buf_t dq = lora ? mk(s, fd, bs + 3 - fd, c.pad, 0, 0, 0.0, 0.0) : mk(s, 2, us, 0, 0, 0, 0.0, 0.0);
  buf_t dc = mk(s, 3, cs, c.pad, 0, 0, 0.0, 0.0), dn = mk(s, 1, ns, 0, 0, 0, 0.0, 0.0);
  if (c.gap) dp.shape[1] = c.r;
  poison(&dx), poison(&dxo), poison(&dp), poison(&dq), poison(&dc), poison(&dn);
  int32_t *idh = malloc((size_t)M * sizeof(int32_t) + 4), *idd = NULL;
  for (int64_t m = 0; m < M; ++m) idh[m] = (int32_t)((m / 3) % (A + 2)) - 1;
  CK(cudaMalloc((void **)&idd, (size_t)M * sizeof(int32_t) + 4));
  CK(cudaMemcpy(idd, idh, (size_t)M * sizeof(int32_t), cudaMemcpyHostToDevice));
  int64_t ids_shape[1] = {M};
  fusedk_tensor ih = fusedk_tensor_cpu(idh, FUSEDK_I32, 1, ids_shape), idv = ih;
  idv.data = idd, idv.device.device_type = FUSEDK_DEVICE_CUDA;
  const fusedk_tensor *ic = c.ids ? &ih : NULL, *ig = c.ids ? &idv : NULL;
  const fusedk_tensor *cc = c.codes ? &cd.th : NULL, *cg = c.codes ? &cd.td : NULL;
  const fusedk_tensor *dcc = c.codes ? &dc.th : NULL, *dcg = c.codes ? &dc.td : NULL;
  fusedk_status sc, sg;
  int ok = 1;
  if (lora && c.act != FUSEDK_ACT_NONE) { /* the forward's aux_out */
    buf_t y = mk(s, 3, ys, 0, 0, 0, 0.0, 0.0);
    few_bits(&x, 0.25, 8, 0), few_bits(&p, 1.0 / 16, 16, 0), few_bits(&cd, 0, 0, 1);
    poison(&aux);
    sc = fusedk_linear_lowrank(&y.th, &aux.th, &x.th, &q.th, NULL, &p.th, cc, ic, (fusedk_activation)c.act, NULL);
    sg = fusedk_linear_lowrank(&y.td, &aux.td, &x.td, &q.td, NULL, &p.td, cg, ig, (fusedk_activation)c.act, NULL);
    CK(cudaDeviceSynchronize());
    char fw[260];
    snprintf(fw, sizeof fw, "%s forward aux_out", what);
    if (!(ok = !call_failed_counted(fw, sc, sg))) goto out;
    buf_t xa = lin_abs(&x, 1.0), pa = lin_abs(&p, 1.0), ca = lin_abs(&cd, 1.0), qa = lin_abs(&q, 1.0), s1 = lin_abs(&y, 0.0);
    fusedk_linear_lowrank(&s1.th, NULL, &xa.th, &qa.th, NULL, &pa.th, c.codes ? &ca.th : NULL, ic, FUSEDK_ACT_NONE, NULL);
    lin_compare(fw, "", &aux, aux.h, &s1, 1.0, c.K + c.r, 0, 0, NULL);
    free(xa.h), free(pa.h), free(ca.h), free(qa.h), free(s1.h);
    drop(&y);
    CK(cudaMemcpy(aux.d, aux.h, aux.n_alloc * esize(s), cudaMemcpyHostToDevice));
  }
  const fusedk_tensor *zc = c.act != FUSEDK_ACT_NONE ? &aux.th : NULL, *zg = c.act != FUSEDK_ACT_NONE ? &aux.td : NULL;
#define GRAD_CALL(o_dx, o_dp, o_dq, o_dc, o_dn, side, ids_, codes_, aux_)                                              \
  (lora ? fusedk_linear_lowrank_backward(o_dx, o_dp, o_dq, o_dc, o_dn, &dy.side, &x.side, &q.side, &p.side, codes_, ids_, \
                                         aux_, (fusedk_activation)c.act, c.scaling, NULL)                              \
        : fusedk_lowrank_update_backward(o_dx, o_dp, o_dq, o_dc, &dy.side, &x.side, &p.side, codes_, &q.side,          \
                                         c.scaling, NULL))
  sc = GRAD_CALL(&dx.th, &dp.th, &dq.th, dcc, lora ? &dn.th : NULL, th, ic, cc, zc);
  sg = GRAD_CALL(&dx.td, &dp.td, &dq.td, dcg, lora ? &dn.td : NULL, td, ig, cg, zg);
  CK(cudaDeviceSynchronize());
  if (call_failed_counted(what, sc, sg)) goto out;
  {
    const double g1 = c.act == FUSEDK_ACT_NONE || c.act == FUSEDK_ACT_RELU ? 1.0 : 1.13;
    buf_t xa = lin_abs(&x, 1.0), pa = lin_abs(&p, 1.0), ca = lin_abs(&cd, 1.0), qa = lin_abs(&q, 1.0);
    buf_t dya = lin_abs(&dy, g1), dxa = lin_abs(&dx, 0.0), dpa = lin_abs(&dp, 0.0), dqa = lin_abs(&dq, 0.0);
    buf_t dca = lin_abs(&dc, 0.0), dna = lin_abs(&dn, 0.0);
    const fusedk_activation none = FUSEDK_ACT_NONE;
    if (lora)
      fusedk_linear_lowrank_backward(&dxa.th, &dpa.th, &dqa.th, c.codes ? &dca.th : NULL, &dna.th, &dya.th, &xa.th,
                                     &qa.th, &pa.th, c.codes ? &ca.th : NULL, ic, NULL, none, fabsf(c.scaling), NULL);
    else
      fusedk_lowrank_update_backward(&dxa.th, &dpa.th, &dqa.th, c.codes ? &dca.th : NULL, &dya.th, &xa.th, &pa.th,
                                     c.codes ? &ca.th : NULL, &qa.th, fabsf(c.scaling), NULL);
    const int flips = c.act != FUSEDK_ACT_NONE;
    grad_rounded = 2.0 * eps_of(s) * (s == FUSEDK_F32 ? 0.0 : 1.0);
    lin_compare(what, " dx", &dx, dx.h, &dxa, 1.0, c.N + A * c.r, 0, flips, NULL);
    lin_compare(what, lora ? " da" : " dv", &dp, dp.h, &dpa, 1.0, M, 0, flips, NULL);
    lin_compare(what, lora ? " db" : " du_t", &dq, dq.h, &dqa, 1.0, M, 0, flips, NULL);
    if (c.codes) lin_compare(what, " dcodes", &dc, dc.h, &dca, 1.0, c.N, 0, flips, NULL);
    if (lora) lin_compare(what, " dbias", &dn, dn.h, &dna, 1.0, M, 0, flips, NULL);
    { /* the factors alone (no dx, dcodes: lowrank_update_backward's pass skips its dx store) */
      buf_t dp2 = lora ? mk(s, fd, ps + 3 - fd, 0, 0, 0, 0.0, 0.0) : mk(s, 2, vs, c.pad, 0, 0, 0.0, 0.0);
      buf_t dq2 = lora ? mk(s, fd, bs + 3 - fd, c.pad, 0, 0, 0.0, 0.0) : mk(s, 2, us, 0, 0, 0, 0.0, 0.0);
      if (c.gap) dp2.shape[1] = c.r;
      poison(&dp2), poison(&dq2);
      fusedk_status s3 = GRAD_CALL(NULL, &dp2.td, &dq2.td, NULL, NULL, td, ig, cg, zg);
      CK(cudaDeviceSynchronize());
      char fw[260];
      snprintf(fw, sizeof fw, "%s, factors alone", what);
      if (!call_failed_counted(fw, FUSEDK_OK, s3)) {
        lin_compare(fw, lora ? " da" : " dv", &dp2, dp.h, &dpa, 1.0, M, 0, flips, NULL);
        lin_compare(fw, lora ? " db" : " du_t", &dq2, dq.h, &dqa, 1.0, M, 0, flips, NULL);
      }
      drop(&dp2), drop(&dq2);
    }
    grad_rounded = 0.0;
    free(xa.h), free(pa.h), free(ca.h), free(qa.h), free(dya.h), free(dxa.h), free(dpa.h), free(dqa.h), free(dca.h);
    free(dna.h);
    /* dx alone: the same bits */
    fusedk_status s2 = GRAD_CALL(&dxo.td, NULL, NULL, NULL, NULL, td, ig, cg, zg);
    void *h1 = to_host(&dx), *h2 = to_host(&dxo);
    ++checks;
    if (s2 || memcmp(h1, h2, dx.n_alloc * esize(s)))
      printf("FAIL %s: dx alone differs from dx with the rest (%s)\n", what, fusedk_status_name(s2)), ++failures;
    free(h1), free(h2);
  }
#undef GRAD_CALL
out:
  (void)ok;
  drop(&x), drop(&dy), drop(&cd), drop(&aux), drop(&p), drop(&q), drop(&dx), drop(&dxo), drop(&dp), drop(&dq);
  drop(&dc), drop(&dn);
  free(idh);
  CK(cudaFree(idd));
}

/* An inf in x on a row whose id takes no adapter: that row has no h, g or dcodes (selected, not
   multiplied), so db and dcodes stay finite and match the reference (da's column holds x * 0 =
   NaN on both sides: not compared). Tall enough for the one-pass kernel, and short for the
   composed route. */
static void lowrank_grad_inf_case(fusedk_scalar s, int64_t L) {
  const int64_t K = 136, r = 8, N = 72, rp = 8, xs[2] = {L, K}, ys[2] = {L, N}, cs[2] = {L, r};
  const int64_t ps[3] = {1, r, K}, bs[3] = {1, N, r}, wcs[2] = {N, K + rp};
  int64_t ids_shape[1] = {L};
  char what[160];
  snprintf(what, sizeof what, "linear_lowrank_backward %s [%lld,%lld] r=%lld N=%lld inf in x on a row without the "
           "adapter", sname(s), (long long)L, (long long)K, (long long)r, (long long)N);
  buf_t x = mk(s, 2, xs, 0, 0, 0, 1.0, 0.0), dy = mk(s, 2, ys, 0, 0, 0, 1.0, 0.0), cd = mk(s, 2, cs, 0, 0, 0, 1.0, 0.0);
  buf_t p = mk(s, 3, ps, 0, 0, 0, 0.25, 0.0), q = mk(s, 2, wcs, 0, 0, 0, 0.1, 0.0);
  buf_t dq = mk(s, 3, bs, 0, 0, 0, 0.0, 0.0), dc = mk(s, 2, cs, 0, 0, 0, 0.0, 0.0);
  put(x.h, 0, INFINITY, s);
  CK(cudaMemcpy(x.d, x.h, x.n_alloc * esize(s), cudaMemcpyHostToDevice));
  poison(&dq), poison(&dc);
  int32_t *idh = malloc((size_t)L * sizeof(int32_t)), *idd = NULL;
  for (int64_t m = 0; m < L; ++m) idh[m] = m % 3 == 0 ? -1 : 0; /* row 0: no adapter */
  CK(cudaMalloc((void **)&idd, (size_t)L * sizeof(int32_t)));
  CK(cudaMemcpy(idd, idh, (size_t)L * sizeof(int32_t), cudaMemcpyHostToDevice));
  fusedk_tensor ih = fusedk_tensor_cpu(idh, FUSEDK_I32, 1, ids_shape), idv = ih;
  idv.data = idd, idv.device.device_type = FUSEDK_DEVICE_CUDA;
  const fusedk_activation none = FUSEDK_ACT_NONE;
  fusedk_status sc = fusedk_linear_lowrank_backward(NULL, NULL, &dq.th, &dc.th, NULL, &dy.th, &x.th, &q.th, &p.th, &cd.th,
                                                    &ih, NULL, none, 1.0f, NULL);
  fusedk_status sg = fusedk_linear_lowrank_backward(NULL, NULL, &dq.td, &dc.td, NULL, &dy.td, &x.td, &q.td, &p.td, &cd.td,
                                                    &idv, NULL, none, 1.0f, NULL);
  CK(cudaDeviceSynchronize());
  if (!call_failed_counted(what, sc, sg)) {
    buf_t xa = lin_abs(&x, 1.0), pa = lin_abs(&p, 1.0), ca = lin_abs(&cd, 1.0), qa = lin_abs(&q, 1.0);
    buf_t dya = lin_abs(&dy, 1.0), dqa = lin_abs(&dq, 0.0), dca = lin_abs(&dc, 0.0);
    fusedk_linear_lowrank_backward(NULL, NULL, &dqa.th, &dca.th, NULL, &dya.th, &xa.th, &qa.th, &pa.th, &ca.th, &ih,
                                   NULL, none, 1.0f, NULL);
    grad_rounded = 2.0 * eps_of(s) * (s == FUSEDK_F32 ? 0.0 : 1.0);
    lin_compare(what, " db", &dq, dq.h, &dqa, 1.0, L, 0, 0, NULL);
    lin_compare(what, " dcodes", &dc, dc.h, &dca, 1.0, N, 0, 0, NULL);
    grad_rounded = 0.0;
    free(xa.h), free(pa.h), free(ca.h), free(qa.h), free(dya.h), free(dqa.h), free(dca.h);
  }
  drop(&x), drop(&dy), drop(&cd), drop(&p), drop(&q), drop(&dq), drop(&dc);
  free(idh);
  CK(cudaFree(idd));
}

/* ranks 1-128 (7: unaligned rows of v, dv, codes), odd K and N, one row, no rows, strided and
   misaligned x and dx (dx's float32 route), codes; lora: stacked adapters with ids (-1 and A among
   them) and without, a's adapters a row apart (a GEMM an adapter), every act through aux_out */
static void lowrank_grad_cases(fusedk_scalar s) {
  const int n_before = failures;
  const int64_t ranks[] = {1, 7, 8, 16, 64, 128};
  for (size_t i = 0; i < sizeof ranks / sizeof ranks[0]; ++i)
    for (int lora = 0; lora < 2; ++lora)
      run_lowrank_grad((grad_t){.s = s, .lora = lora, .B = 2, .L = 33, .K = 200, .r = ranks[i], .N = 136,
                                .codes = (int)(i % 2), .act = FUSEDK_ACT_NONE, .scaling = 0.5f});
  const grad_t rows[] = {
      {.s = s, .B = 1, .L = 1, .K = 64, .r = 8, .N = 64, .codes = 1, .act = FUSEDK_ACT_NONE, .scaling = 2.0f},
      {.s = s, .B = 3, .L = 7, .K = 999, .r = 12, .N = 131, .codes = 1, .act = FUSEDK_ACT_NONE, .scaling = -0.25f},
      {.s = s, .B = 2, .L = 45, .K = 192, .r = 16, .N = 96, .codes = 1, .act = FUSEDK_ACT_NONE, .scaling = 1.5f,
       .pad = 3, .shift = 1},
      {.s = s, .B = 1, .L = 0, .K = 64, .r = 8, .N = 40, .codes = 1, .act = FUSEDK_ACT_NONE, .scaling = 1.0f},
      {.s = s, .B = 1, .L = 4000, .K = 520, .r = 8, .N = 456, .codes = 1, .act = FUSEDK_ACT_NONE, .scaling = 1.0f},
      {.s = s, .B = 1, .L = 129, .K = 1032, .r = 7, .N = 24, .act = FUSEDK_ACT_NONE, .scaling = -1.0f},
      {.s = s, .B = 5, .L = 13, .K = 72, .r = 40, .N = 1096, .codes = 1, .act = FUSEDK_ACT_NONE, .scaling = 0.75f},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; ++i)
    for (int lora = 0; lora < 2; ++lora) {
      grad_t c = rows[i];
      c.lora = lora;
      run_lowrank_grad(c);
    }
  const int acts[] = {FUSEDK_ACT_RELU, FUSEDK_ACT_GELU_TANH, FUSEDK_ACT_GELU, FUSEDK_ACT_SILU};
  for (size_t i = 0; i < 4; ++i)
    run_lowrank_grad((grad_t){.s = s, .lora = 1, .B = 1, .L = 70, .K = 256, .r = 16, .N = 192, .codes = 1,
                              .act = acts[i], .scaling = 2.0f});
  const grad_t stacks[] = {
      {.s = s, .lora = 1, .B = 2, .L = 33, .K = 200, .r = 16, .N = 136, .A = 4, .codes = 1, .ids = 1,
       .act = FUSEDK_ACT_NONE, .scaling = 0.5f},
      {.s = s, .lora = 1, .B = 2, .L = 33, .K = 200, .r = 16, .N = 136, .A = 4, .act = FUSEDK_ACT_GELU_TANH,
       .scaling = 0.5f},
      {.s = s, .lora = 1, .B = 1, .L = 70, .K = 128, .r = 5, .N = 64, .A = 3, .codes = 1, .ids = 1,
       .act = FUSEDK_ACT_NONE, .scaling = 1.0f, .gap = 1},
      {.s = s, .lora = 1, .B = 3, .L = 7, .K = 999, .r = 12, .N = 130, .A = 2, .ids = 1, .act = FUSEDK_ACT_RELU,
       .scaling = 0.25f, .gap = 1},
      {.s = s, .lora = 1, .B = 1, .L = 600, .K = 256, .r = 8, .N = 72, .A = 16, .ids = 1, .act = FUSEDK_ACT_NONE,
       .scaling = 1.0f},
      {.s = s, .lora = 1, .B = 1, .L = 20, .K = 0, .r = 8, .N = 24, .act = FUSEDK_ACT_NONE, .scaling = 1.0f},
      {.s = s, .lora = 1, .B = 2, .L = 67, .K = 264, .r = 24, .N = 136, .A = 1, .codes = 1, .ids = 1,
       .act = FUSEDK_ACT_GELU_TANH, .scaling = 0.5f},
  };
  for (size_t i = 0; i < sizeof stacks / sizeof stacks[0]; ++i) run_lowrank_grad(stacks[i]);
  /* rows enough for the one-pass kernel (64-row blocks for 3/4 of the SMs: 8500 rows up to 177 SMs):
     every rank tier, v's and w_cat's rows not a multiple of 8, codes, one adapter with ids, acts */
  const grad_t tall[] = {
      {.s = s, .B = 1, .L = 8500, .K = 264, .r = 8, .N = 136, .codes = 1, .act = FUSEDK_ACT_NONE, .scaling = 0.5f},
      {.s = s, .lora = 1, .B = 1, .L = 8500, .K = 264, .r = 16, .N = 136, .A = 1, .codes = 1, .ids = 1,
       .act = FUSEDK_ACT_GELU_TANH, .scaling = 0.5f},
      {.s = s, .B = 2, .L = 4300, .K = 200, .r = 7, .N = 136, .act = FUSEDK_ACT_NONE, .scaling = -1.5f},
      {.s = s, .B = 1, .L = 8501, .K = 136, .r = 40, .N = 264, .codes = 1, .act = FUSEDK_ACT_NONE, .scaling = 0.25f},
      {.s = s, .B = 1, .L = 8500, .K = 128, .r = 128, .N = 72, .codes = 1, .act = FUSEDK_ACT_NONE, .scaling = 1.0f},
      {.s = s, .lora = 1, .B = 1, .L = 8500, .K = 200, .r = 64, .N = 136, .act = FUSEDK_ACT_NONE, .scaling = 2.0f},
      {.s = s, .lora = 1, .B = 1, .L = 8500, .K = 136, .r = 5, .N = 72, .codes = 1, .act = FUSEDK_ACT_RELU,
       .scaling = 1.0f},
      {.s = s, .lora = 1, .B = 1, .L = 8500, .K = 72, .r = 128, .N = 64, .act = FUSEDK_ACT_NONE, .scaling = 0.5f},
  };
  for (size_t i = 0; i < (small ? 2 : sizeof tall / sizeof tall[0]); ++i) run_lowrank_grad(tall[i]);
  lowrank_grad_inf_case(s, 8500), lowrank_grad_inf_case(s, 70);
  if (failures == n_before)
    printf("ok   %s lowrank_update_backward, linear_lowrank_backward (ranks 1-128, codes, odd K and N, 0 and 1 "
           "rows, strided, misaligned, stacked adapters with and without ids, a's adapters apart, acts, K 0, "
           "the one-pass kernel's tall cases)\n",
           sname(s));
}


/* --- [linear] FP8: quantize_fp8, dequantize_fp8 (bitwise against the CPU) and linear_fp8 ------ */

/* both sides' copies of b equal (signed zeros too), NaN bits and sign aside */
static int same_bits(const buf_t *b, const void *g) {
  for (size_t i = 0; i < b->n_alloc; ++i) {
    const double c = get(b->h, i, b->s), v = get(g, i, b->s);
    if (c != c && v != v) continue; /* NaN's sign: x86's invalid operations give -NaN, the GPU's +NaN */
    if (c != v || signbit(c) != signbit(v)) return 0;
  }
  return 1;
}

/* x [R1, R2, D] (rows padded, base shifted) quantized on both sides, data and scales compared
   bit for bit, then (e4m3) dequantized back on both sides from the CPU's data; specials: a row
   of zeros, one with a NaN, one with an Inf, one of values near the dtype's largest. i8:
   quantize_int8 */
static void run_quant(fusedk_scalar s, int64_t R1, int64_t R2, int64_t D, int64_t pad, size_t shift, int specials,
                      int i8) {
  char what[160];
  snprintf(what, sizeof what, "%s %s [%lld,%lld,%lld] pad=%lld shift=%zu%s", i8 ? "quantize_int8" : "quantize_fp8",
           sname(s), (long long)R1, (long long)R2, (long long)D, (long long)pad, shift,
           specials ? " zero/NaN/Inf/large rows" : "");
  const int64_t xs[3] = {R1, R2, D}, ss[2] = {R1, R2};
  buf_t x = mk(s, 3, xs, pad, shift, 0, 3.0, 0.5), q = mk(i8 ? FUSEDK_I8 : FUSEDK_E4M3, 3, xs, pad, shift, 0, 0.0, 0.0);
  buf_t sc = mk(FUSEDK_F32, 2, ss, 0, 0, 0, 0.0, 0.0), y = mk(s, 3, xs, pad, shift, 0, 0.0, 0.0);
  if (specials && R1 * R2 >= 4) {
    const int64_t ld = D + pad;
    for (int64_t d = 0; d < D; ++d) {
      put(x.h, x.off + d, 0.0, s);
      put(x.h, x.off + 3 * ld + d, (s == FUSEDK_F16 ? 60000.0 : 1e30) * (d % 2 ? -1.0 : 0.9), s);
    }
    put(x.h, x.off + ld + D / 2, NAN, s);
    put(x.h, x.off + 2 * ld + D - 1, INFINITY, s);
    if (s == FUSEDK_F16) /* put's float16 conversion takes finite normal values only */
      ((uint16_t *)x.h)[x.off + ld + D / 2] = 0x7e00, ((uint16_t *)x.h)[x.off + 2 * ld + D - 1] = 0x7c00;
    CK(cudaMemcpy(x.d, x.h, x.n_alloc * esize(s), cudaMemcpyHostToDevice));
  }
  poison(&q), poison(&sc), poison(&y);
  const fusedk_scaled_tensor qh = {&q.th, &sc.th}, qd = {&q.td, &sc.td};
  fusedk_status c = i8 ? fusedk_quantize_int8(&qh, &x.th, NULL) : fusedk_quantize_fp8(&qh, &x.th, NULL);
  fusedk_status g = i8 ? fusedk_quantize_int8(&qd, &x.td, NULL) : fusedk_quantize_fp8(&qd, &x.td, NULL);
  CK(cudaDeviceSynchronize());
  if (!call_failed_counted(what, c, g)) {
    void *gq = to_host(&q), *gs = to_host(&sc);
    ++checks;
    if (!same_bits(&q, gq) || !same_bits(&sc, gs)) printf("FAIL %s: the GPU's data or scales differ\n", what), ++failures;
    free(gq), free(gs);
  }
  if (!i8 && !c && !g) {
    /* dequantize from the CPU's data on both sides */
    CK(cudaMemcpy(q.d, q.h, q.n_alloc, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(sc.d, sc.h, sc.n_alloc * 4, cudaMemcpyHostToDevice));
    char dq[200];
    snprintf(dq, sizeof dq, "dequantize_fp8 of %s", what);
    c = fusedk_dequantize_fp8(&y.th, &qh, NULL), g = fusedk_dequantize_fp8(&y.td, &qd, NULL);
    CK(cudaDeviceSynchronize());
    if (!call_failed_counted(dq, c, g)) {
      void *gy = to_host(&y);
      ++checks;
      if (!same_bits(&y, gy)) printf("FAIL %s: the GPU's values differ\n", dq), ++failures;
      free(gy);
    }
  }
  drop(&x), drop(&q), drop(&sc), drop(&y);
}

static void quant_cases(fusedk_scalar s) {
  const int n_before = failures;
  for (int i8 = 0; i8 < 2; ++i8) {
    run_quant(s, 2, 5, 64, 0, 0, 1, i8);
    run_quant(s, 3, 7, 24, 8, 0, 1, i8);    /* padded rows: the vector path */
    run_quant(s, 1, 9, 33, 2, 1, 1, i8);    /* odd D, shifted: one element a lane */
    run_quant(s, 1, 1, 1, 0, 0, 0, i8);
    run_quant(s, 2, 1000, 3072, 0, 0, 1, i8);
    if (!small) run_quant(s, 1, 1500, 13824, 0, 0, 0, i8);
  }
  if (failures == n_before)
    printf("ok   %s quantize_fp8, dequantize_fp8, quantize_int8 (bitwise; zero, NaN, Inf, large rows; odd D, padded, "
           "shifted)\n", sname(s));
}

/* glu_fp8: x [R1, R2, 2H] (rows padded, base shifted) on both sides; the GPU makes the values in
   float32 (the CPU in double), so a scale may differ in its last bits and a value at an e4m3
   rounding boundary by a step: at most 1 % of the elements, none by more than a step */
static void run_glu_quant(fusedk_scalar s, int64_t R1, int64_t R2, int64_t H, int64_t pad, size_t shift, int act,
                          int half) {
  char what[160];
  snprintf(what, sizeof what, "glu_fp8 %s [%lld,%lld,%lld] act=%d half=%d pad=%lld shift=%zu", sname(s), (long long)R1,
           (long long)R2, (long long)(2 * H), act, half, (long long)pad, shift);
  const int64_t xs[3] = {R1, R2, 2 * H}, qs[3] = {R1, R2, H}, ss[2] = {R1, R2};
  buf_t x = mk(s, 3, xs, pad, shift, 0, 2.0, 0.25), q = mk(FUSEDK_E4M3, 3, qs, pad, shift, 0, 0.0, 0.0);
  buf_t sc = mk(FUSEDK_F32, 2, ss, 0, 0, 0, 0.0, 0.0);
  poison(&q), poison(&sc);
  const fusedk_scaled_tensor qh = {&q.th, &sc.th}, qd = {&q.td, &sc.td};
  fusedk_status c = fusedk_glu_fp8(&qh, &x.th, (fusedk_activation)act, (fusedk_glu_half)half, NULL);
  fusedk_status g = fusedk_glu_fp8(&qd, &x.td, (fusedk_activation)act, (fusedk_glu_half)half, NULL);
  CK(cudaDeviceSynchronize());
  if (!call_failed_counted(what, c, g)) {
    uint8_t *gq = to_host(&q);
    float *gs = to_host(&sc);
    int64_t apart = 0, worse = 0, rows_bad = 0;
    for (int64_t r = 0; r < R1 * R2; ++r) {
      const float a = ((float *)sc.h)[r], b = gs[r];
      rows_bad += !(fabsf(a - b) <= 1e-5f * a);
      for (int64_t d = 0; d < H; ++d) {
        const size_t i = q.off + (size_t)(r * (H + pad) + d);
        const double u = get(q.h, i, FUSEDK_E4M3), v = get(gq, i, FUSEDK_E4M3);
        apart += u != v;
        worse += !(fabs(u - v) <= fmax(fabs(u), fabs(v)) / 8.0 + 1.0 / 512.0);
      }
    }
    ++checks;
    if (rows_bad || worse || apart > R1 * R2 * H / 100 + 2)
      printf("FAIL %s: %lld scales off, %lld values a step apart, %lld further\n", what, (long long)rows_bad,
             (long long)apart, (long long)worse), ++failures;
    free(gq), free(gs);
  }
  drop(&x), drop(&q), drop(&sc);
}

static void glu_quant_cases(fusedk_scalar s) {
  const int n_before = failures;
  run_glu_quant(s, 2, 5, 64, 0, 0, FUSEDK_ACT_SILU, FUSEDK_GLU_FIRST);
  run_glu_quant(s, 3, 7, 24, 8, 0, FUSEDK_ACT_GELU_TANH, FUSEDK_GLU_SECOND); /* padded rows: the vector path */
  run_glu_quant(s, 1, 9, 33, 2, 1, FUSEDK_ACT_GELU, FUSEDK_GLU_FIRST);     /* odd H, shifted: one element a lane */
  run_glu_quant(s, 1, 1, 1, 0, 0, FUSEDK_ACT_RELU, FUSEDK_GLU_SECOND);
  run_glu_quant(s, 1, 300, 8192 / (int)esize(s) * 2, 0, 0, FUSEDK_ACT_SILU, FUSEDK_GLU_SECOND); /* a block a row */
  if (!small) run_glu_quant(s, 2, 2000, 3072, 0, 0, FUSEDK_ACT_SILU, FUSEDK_GLU_FIRST);
  if (failures == n_before)
    printf("ok   %s glu_fp8 (each act and half; odd H, padded, shifted; a block a row)\n", sname(s));
}

/* linear_fp8: x [B, L, K] and w [N, K] made as floats, quantized on the CPU (the data both sides
   read); y (and aux) against the CPU's, bound by the same GEMM on |data| (lin_tol with its
   reduced-precision term: FP8 tensor cores accumulate in fewer bits between promotions) */
typedef struct {
  fusedk_scalar s;
  int64_t B, L, N, K;
  int act, bias, aux;
  int64_t pad;
  size_t shift;
  int precise; /* fast_accum 0: sums promoted out of the tensor cores' accumulator */
} fp8_t;

static void run_linear_fp8(fp8_t c) {
  const fusedk_scalar s = c.s;
  char what[200];
  snprintf(what, sizeof what, "linear_fp8 %s [%lld,%lld,%lld] N=%lld act=%s%s%s pad=%lld shift=%zu%s", sname(s),
           (long long)c.B, (long long)c.L, (long long)c.K, (long long)c.N, act_name(c.act), c.bias ? " bias" : "",
           c.aux ? " aux" : "", (long long)c.pad, c.shift, c.precise ? " precise" : "");
  const int64_t xs[3] = {c.B, c.L, c.K}, ws[2] = {c.N, c.K}, bs[1] = {c.N}, ys[3] = {c.B, c.L, c.N}, xss[2] = {c.B, c.L};
  buf_t xf = mk(FUSEDK_F32, 3, xs, 0, 0, 0, 1.0, 0.0), wf = mk(FUSEDK_F32, 2, ws, 0, 0, 0, 1.0 / sqrt((double)c.K), 0.0);
  buf_t x = mk(FUSEDK_E4M3, 3, xs, c.pad, c.shift, 0, 0.0, 0.0), w = mk(FUSEDK_E4M3, 2, ws, c.pad, 0, 0, 0.0, 0.0);
  buf_t xsc = mk(FUSEDK_F32, 2, xss, 0, 0, 0, 0.0, 0.0), wsc = mk(FUSEDK_F32, 1, bs, 0, 0, 0, 0.0, 0.0);
  buf_t b = mk(s, 1, bs, 0, 0, 0, 0.5, 0.0), y = mk(s, 3, ys, c.pad, c.shift, 0, 0.0, 0.0), z = mk(s, 3, ys, 0, 0, 0, 0.0, 0.0);
  const fusedk_scaled_tensor qx = {&x.th, &xsc.th}, qw = {&w.th, &wsc.th};
  fusedk_status st = fusedk_quantize_fp8(&qx, &xf.th, NULL);
  if (!st) st = fusedk_quantize_fp8(&qw, &wf.th, NULL);
  CK(cudaMemcpy(x.d, x.h, x.n_alloc, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(w.d, w.h, w.n_alloc, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(xsc.d, xsc.h, xsc.n_alloc * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(wsc.d, wsc.h, wsc.n_alloc * 4, cudaMemcpyHostToDevice));
  poison(&y), poison(&z);
  const fusedk_scaled_tensor dx = {&x.td, &xsc.td}, dw = {&w.td, &wsc.td};
  const int need_z = c.aux || c.act == FUSEDK_ACT_GELU || c.act == FUSEDK_ACT_SILU;
  fusedk_status sc = st ? st : fusedk_linear_fp8(&y.th, need_z ? &z.th : NULL, &qx, &qw, c.bias ? &b.th : NULL,
                                                  (fusedk_activation)c.act, !c.precise, NULL);
  fusedk_status sg = fusedk_linear_fp8(&y.td, c.aux ? &z.td : NULL, &dx, &dw, c.bias ? &b.td : NULL,
                                       (fusedk_activation)c.act, !c.precise, NULL);
  CK(cudaDeviceSynchronize());
  if (!call_failed_counted(what, sc, sg)) {
    buf_t xa = lin_abs(&x, 1.0), wa = lin_abs(&w, 1.0), ba = lin_abs(&b, 1.0), s1 = lin_abs(&y, 0.0);
    const fusedk_scaled_tensor ax = {&xa.th, &xsc.th}, aw = {&wa.th, &wsc.th};
    fusedk_linear_fp8(&s1.th, NULL, &ax, &aw, c.bias ? &ba.th : NULL, FUSEDK_ACT_NONE, 1, NULL);
    const double g = c.act == FUSEDK_ACT_NONE || c.act == FUSEDK_ACT_RELU ? 1.0 : 1.13;
    const int two_pass = c.act == FUSEDK_ACT_GELU || c.act == FUSEDK_ACT_SILU;
    lin_compare(what, "", &y, y.h, &s1, g, c.K, 1, 0, two_pass ? &z : NULL);
    if (c.aux) lin_compare(what, " (aux)", &z, z.h, &s1, 1.0, c.K, 1, 0, NULL);
    free(xa.h), free(wa.h), free(ba.h), free(s1.h);
  }
  drop(&xf), drop(&wf), drop(&x), drop(&w), drop(&xsc), drop(&wsc), drop(&b), drop(&y), drop(&z);
}

static void linear_fp8_cases(fusedk_scalar s) {
  const int n_before = failures;
  for (int act = FUSEDK_ACT_GELU; act <= FUSEDK_ACT_NONE; ++act) {
    run_linear_fp8((fp8_t){.s = s, .B = 2, .L = 33, .N = 96, .K = 64, .act = act, .bias = 1, .aux = 1});
    run_linear_fp8((fp8_t){.s = s, .B = 1, .L = 7, .N = 72, .K = 40, .act = act, .aux = act % 2, .pad = 3, .shift = 1});
  }
  const fp8_t rows[] = {
      {.s = s, .B = 1, .L = 1, .N = 1, .K = 16, .act = FUSEDK_ACT_RELU, .bias = 1, .aux = 1},
      {.s = s, .B = 1, .L = 1, .N = 8, .K = 3, .act = FUSEDK_ACT_NONE, .bias = 1},             /* K 3: the exact route */
      {.s = s, .B = 2, .L = 300, .N = 256, .K = 128, .act = FUSEDK_ACT_GELU_TANH, .bias = 1, .pad = 16},
      {.s = s, .B = 1, .L = 17, .N = 4095, .K = 1008, .act = FUSEDK_ACT_GELU_TANH, .bias = 1, .aux = 1}, /* odd N */
      {.s = s, .B = 1, .L = 64, .N = 128, .K = 1000, .act = FUSEDK_ACT_SILU, .bias = 1},      /* K % 16 != 0 */
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; ++i) run_linear_fp8(rows[i]);
  run_linear_fp8((fp8_t){.s = s, .B = 2, .L = 33, .N = 96, .K = 64, .act = FUSEDK_ACT_GELU_TANH, .bias = 1, .precise = 1});
  if (!small) {
    run_linear_fp8((fp8_t){.s = s, .B = 2, .L = 512, .N = 3072, .K = 3072, .act = FUSEDK_ACT_GELU_TANH, .bias = 1});
    run_linear_fp8((fp8_t){.s = s, .B = 1, .L = 1024, .N = 1024, .K = 12288, .act = FUSEDK_ACT_NONE, .precise = 1});
  }
  if (failures == n_before)
    printf("ok   %s linear_fp8 (5 acts, bias, aux, odd N, K 3 and 1000 (exact route), strided, misaligned, tuned)\n", sname(s));
}

/* linear_w8: x [B, L, K] of s, w [N, K] quantize_int8'd on the CPU (the data both sides read);
   y (and aux) against the CPU's, bound by the same product on |x| and |w| (float32 sums) */
static void run_linear_w8(fusedk_scalar s, int64_t B, int64_t L, int64_t N, int64_t K, int act, int bias, int aux,
                          int64_t pad, size_t shift) {
  char what[200];
  snprintf(what, sizeof what, "linear_w8 %s [%lld,%lld,%lld] N=%lld act=%s%s%s pad=%lld shift=%zu", sname(s),
           (long long)B, (long long)L, (long long)K, (long long)N, act_name(act), bias ? " bias" : "", aux ? " aux" : "",
           (long long)pad, shift);
  const int64_t xs[3] = {B, L, K}, ws[2] = {N, K}, bs[1] = {N}, ys[3] = {B, L, N};
  buf_t x = mk(s, 3, xs, pad, shift, 0, 1.0, 0.0), wf = mk(FUSEDK_F32, 2, ws, 0, 0, 0, 1.0 / sqrt((double)K), 0.0);
  buf_t w = mk(FUSEDK_I8, 2, ws, pad, 0, 0, 0.0, 0.0), wsc = mk(FUSEDK_F32, 1, bs, 0, 0, 0, 0.0, 0.0);
  buf_t b = mk(s, 1, bs, 0, 0, 0, 0.5, 0.0), y = mk(s, 3, ys, pad, shift, 0, 0.0, 0.0), z = mk(s, 3, ys, 0, 0, 0, 0.0, 0.0);
  const fusedk_scaled_tensor qw = {&w.th, &wsc.th}, dw = {&w.td, &wsc.td};
  fusedk_status st = fusedk_quantize_int8(&qw, &wf.th, NULL);
  CK(cudaMemcpy(w.d, w.h, w.n_alloc, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(wsc.d, wsc.h, wsc.n_alloc * 4, cudaMemcpyHostToDevice));
  poison(&y), poison(&z);
  const int two_pass = act == FUSEDK_ACT_GELU || act == FUSEDK_ACT_SILU; /* act of z rounded, as linear's */
  fusedk_status sc = st ? st : fusedk_linear_w8(&y.th, aux || two_pass ? &z.th : NULL, &x.th, &qw, bias ? &b.th : NULL,
                                                 (fusedk_activation)act, NULL);
  fusedk_status sg = fusedk_linear_w8(&y.td, aux ? &z.td : NULL, &x.td, &dw, bias ? &b.td : NULL, (fusedk_activation)act, NULL);
  CK(cudaDeviceSynchronize());
  if (!call_failed_counted(what, sc, sg)) {
    buf_t xa = lin_abs(&x, 1.0), wa = lin_abs(&w, 1.0), ba = lin_abs(&b, 1.0), s1 = lin_abs(&y, 0.0);
    const fusedk_scaled_tensor aw = {&wa.th, &wsc.th};
    fusedk_linear_w8(&s1.th, NULL, &xa.th, &aw, bias ? &ba.th : NULL, FUSEDK_ACT_NONE, NULL);
    const double g = act == FUSEDK_ACT_NONE || act == FUSEDK_ACT_RELU ? 1.0 : 1.13;
    lin_compare(what, "", &y, y.h, &s1, g, K, 0, 0, two_pass ? &z : NULL);
    if (aux) lin_compare(what, " (aux)", &z, z.h, &s1, 1.0, K, 0, 0, NULL);
    free(xa.h), free(wa.h), free(ba.h), free(s1.h);
  }
  drop(&x), drop(&wf), drop(&w), drop(&wsc), drop(&b), drop(&y), drop(&z);
}

static void linear_w8_cases(fusedk_scalar s) {
  const int n_before = failures;
  for (int act = FUSEDK_ACT_GELU; act <= FUSEDK_ACT_NONE; ++act) {
    run_linear_w8(s, 1, 1, 96, 64, act, 1, 1, 0, 0);
    run_linear_w8(s, 2, 3, 72, 40, act, act % 2, act % 2, 3, 1); /* K % 16, padded, shifted: a byte a lane */
  }
  run_linear_w8(s, 1, 1, 1, 16, FUSEDK_ACT_RELU, 1, 0, 0, 0);
  run_linear_w8(s, 1, 3, 40, 64, FUSEDK_ACT_NONE, 1, 0, 0, 1); /* K % 16 == 0, x's base misaligned: a byte a lane */
  run_linear_w8(s, 1, 3, 40, 64, FUSEDK_ACT_NONE, 1, 0, 3, 0); /* K % 16 == 0, rows of 67: a byte a lane */
  run_linear_w8(s, 1, 1, 8, 3, FUSEDK_ACT_NONE, 1, 0, 0, 0);
  run_linear_w8(s, 1, 5, 4093, 256, FUSEDK_ACT_NONE, 1, 0, 16, 0); /* odd N, 5 rows: a second row block */
  run_linear_w8(s, 2, 1, 18432, 3072, FUSEDK_ACT_NONE, 1, 0, 0, 0); /* Flux's modulation, B 2 */
  if (!small) run_linear_w8(s, 1, 40, 1024, 5120, FUSEDK_ACT_SILU, 1, 1, 0, 0);
  if (failures == n_before)
    printf("ok   %s linear_w8 (5 acts, bias, aux, odd N, K 3 and 40 (a byte a lane), strided, misaligned, 1-40 rows)\n",
           sname(s));
}

/* --- [conv] conv against the CPU reference: both load paths (16-byte chunks; channels not in 8s,
   pixels off the 16-byte grid: `cpad` elements after each pixel, `shift` before the base), the
   tile tails (pixels, channels, Co), strides, zero and replicated time padding, the epilogue ---- */
typedef struct {
  int nd;
  int64_t x[5], w[5];
  int stride, pad, stride_t, pad_t, pad_t_back, rep, act, bias, res;
  int64_t cpad;
  size_t shift;
  int up; /* x's nearest upsampling (1: none) */
} conv_t;

static void run_conv(fusedk_scalar s, conv_t c) {
  char what[240];
  const int v = c.nd == 5;
  int64_t o[5], K = 1;
  for (int i = 1; i < c.nd; ++i) K *= c.w[i];
  o[0] = c.x[0], o[c.nd - 1] = c.w[0];
  if (v) o[1] = (c.x[1] + c.pad_t + c.pad_t_back - c.w[1]) / c.stride_t + 1;
  const int up = c.up > 1 ? c.up : 1;
  for (int i = 1 + v; i < c.nd - 1; ++i) o[i] = (c.x[i] * up + 2 * c.pad - c.w[i]) / c.stride + 1;
  snprintf(what, sizeof what, "conv %s x [%lld,%lld,%lld,%lld%s] w [%lld,...,%lld] k %lld stride %d pad %d%s%s act %s%s%s "
           "cpad %lld shift %zu up %d", sname(s), (long long)c.x[0], (long long)c.x[1], (long long)c.x[2], (long long)c.x[3],
           v ? ",..." : "", (long long)c.w[0], (long long)c.w[c.nd - 1], (long long)(K / c.w[c.nd - 1]), c.stride,
           c.pad, c.rep & 2 ? " edge-replicated" : v ? (c.rep & 1 ? " causal replicate" : " time pad") : "",
           c.stride_t > 1 ? " stride_t" : "",
           act_name(c.act), c.bias ? " bias" : "", c.res ? " residual" : "", (long long)c.cpad, c.shift, up);
  const int64_t co = c.w[0];
  buf_t x = mk(s, c.nd, c.x, c.cpad, c.shift, 0, 1.0, 0.0), w = mk(s, c.nd, c.w, 0, 0, 0, 1.0 / sqrt((double)K), 0.0);
  buf_t b = mk(s, 1, &co, 0, 0, 0, 0.5, 0.0), r = mk(s, c.nd, o, c.cpad, c.shift, 0, 1.0, 0.0);
  buf_t y = mk(s, c.nd, o, c.cpad, c.shift, 0, 0.0, 0.0);
  poison(&y);
  fusedk_status st[2];
  for (int d = 0; d < 2; ++d)
    st[d] = fusedk_conv(d ? &y.td : &y.th, d ? &x.td : &x.th, d ? &w.td : &w.th, !c.bias ? NULL : d ? &b.td : &b.th,
                        !c.res ? NULL : d ? &r.td : &r.th, c.stride, c.pad, c.stride_t, c.pad_t, c.pad_t_back, c.rep,
                        (fusedk_activation)c.act, up, NULL);
  if (!call_failed_counted(what, st[0], st[1])) {
    ++checks;
    if (compare(what, &y, c.res ? &r : NULL, 0, eps_of(s), 1)) ++failures;
  }
  drop(&x), drop(&w), drop(&b), drop(&r), drop(&y);
}

static void conv_cases(fusedk_scalar s) {
  const int n_before = failures, N = FUSEDK_ACT_NONE, SILU = FUSEDK_ACT_SILU;
  /* {nd, x, w, stride, pad, stride_t, pad_t, pad_t_back, replicate, act, bias, residual, cpad, shift} */
  for (int act = FUSEDK_ACT_GELU; act <= N; ++act)
    run_conv(s, (conv_t){4, {2, 9, 7, 64}, {40, 3, 3, 64}, 1, 1, 1, 0, 0, 0, act, act % 2, act % 2 == 0, 0, 0, 1});
  run_conv(s, (conv_t){4, {1, 17, 19, 72}, {130, 3, 3, 72}, 2, 1, 1, 0, 0, 0, N, 1, 1, 0, 0, 1});   /* Ci, Co tails */
  run_conv(s, (conv_t){4, {1, 9, 8, 12}, {7, 3, 3, 12}, 1, 1, 1, 0, 0, 0, N, 1, 0, 0, 0, 1});       /* Ci % 8 */
  run_conv(s, (conv_t){4, {2, 6, 5, 3}, {5, 3, 3, 3}, 1, 1, 1, 0, 0, 0, SILU, 1, 1, 0, 0, 1});      /* RGB */
  run_conv(s, (conv_t){4, {1, 7, 9, 32}, {24, 3, 3, 32}, 1, 1, 1, 0, 0, 0, N, 1, 1, 3, 0, 1});      /* padded pixels */
  run_conv(s, (conv_t){4, {1, 7, 9, 32}, {24, 1, 1, 32}, 1, 0, 1, 0, 0, 0, N, 0, 0, 0, 1, 1});      /* shifted base */
  run_conv(s, (conv_t){4, {1, 1, 1, 256}, {17, 3, 3, 256}, 1, 1, 1, 0, 0, 0, N, 1, 0, 0, 0, 1});    /* a 1x1 image */
  run_conv(s, (conv_t){4, {3, 1, 37, 16}, {8, 1, 5, 16}, 2, 2, 1, 0, 0, 0, N, 1, 1, 0, 0, 1});      /* 1-row images */
  run_conv(s, (conv_t){5, {1, 5, 9, 10, 32}, {48, 3, 3, 3, 32}, 1, 1, 1, 2, 0, 0, N, 1, 1, 0, 0, 1}); /* Wan's */
  run_conv(s, (conv_t){5, {2, 4, 6, 7, 24}, {16, 3, 3, 3, 24}, 1, 1, 1, 2, 0, 1, SILU, 1, 0, 0, 0, 1}); /* LTX's */
  run_conv(s, (conv_t){5, {1, 7, 6, 6, 16}, {16, 3, 1, 1, 16}, 1, 0, 2, 1, 1, 0, N, 1, 0, 5, 0, 1}); /* time conv */
  run_conv(s, (conv_t){5, {2, 4, 9, 7, 64}, {24, 3, 3, 3, 64}, 1, 1, 1, 2, 0, 3, N, 1, 1, 0, 0, 1}); /* Mochi's */
  run_conv(s, (conv_t){4, {1, 6, 5, 12}, {9, 5, 5, 12}, 2, 3, 1, 0, 0, 2, SILU, 1, 0, 0, 0, 1});   /* edges, Ci % 8 */
  run_conv(s, (conv_t){4, {2, 7, 9, 64}, {40, 3, 3, 64}, 1, 1, 1, 0, 0, 0, N, 1, 0, 0, 0, 2});   /* Upsample2D + conv */
  run_conv(s, (conv_t){4, {1, 5, 4, 12}, {8, 3, 3, 12}, 1, 1, 1, 0, 0, 2, N, 1, 1, 3, 0, 2});    /* element path */
  run_conv(s, (conv_t){5, {1, 3, 5, 6, 32}, {16, 1, 3, 3, 32}, 1, 1, 1, 0, 0, 0, N, 1, 0, 0, 0, 2}); /* Wan's frames */
  /* patches the Hopper kernel takes (TMA boxes): each channel tile width, both tile tails, the
     upsampled phases, causal zero and replicated frames, a 1x1 kernel */
  run_conv(s, (conv_t){4, {2, 16, 24, 72}, {130, 3, 3, 72}, 1, 1, 1, 0, 0, 0, SILU, 1, 1, 0, 0, 1});
  run_conv(s, (conv_t){4, {1, 20, 36, 64}, {64, 3, 3, 64}, 1, 1, 1, 0, 0, 0, FUSEDK_ACT_GELU, 1, 0, 0, 0, 2});
  run_conv(s, (conv_t){5, {1, 5, 12, 20, 32}, {48, 3, 3, 3, 32}, 1, 1, 1, 2, 0, 0, N, 1, 1, 0, 0, 1});
  run_conv(s, (conv_t){5, {2, 4, 16, 8, 24}, {96, 3, 3, 3, 24}, 1, 1, 1, 2, 0, 1, SILU, 1, 0, 0, 0, 1});
  run_conv(s, (conv_t){4, {2, 16, 16, 256}, {512, 1, 1, 256}, 1, 0, 1, 0, 0, 0, N, 1, 1, 0, 0, 1});
  run_conv(s, (conv_t){4, {1, 12, 16, 128}, {256, 3, 3, 128}, 1, 1, 1, 0, 0, 0, N, 0, 1, 8, 0, 2}); /* padded pixels */
  if (!small) {
    run_conv(s, (conv_t){4, {2, 64, 64, 320}, {320, 3, 3, 320}, 1, 1, 1, 0, 0, 0, SILU, 1, 0, 0, 0, 1}); /* the seed's */
    run_conv(s, (conv_t){5, {1, 3, 20, 24, 384}, {384, 3, 3, 3, 384}, 1, 1, 1, 2, 0, 0, N, 1, 1, 0, 0, 1});
    /* more patches than an H100's 132 SMs: the 64- and 96-channel tiles, several tiles a block */
    run_conv(s, (conv_t){4, {1, 64, 272, 8}, {64, 3, 3, 8}, 1, 1, 1, 0, 0, 0, SILU, 1, 1, 0, 0, 1});
    run_conv(s, (conv_t){4, {1, 96, 192, 32}, {96, 3, 3, 32}, 1, 1, 1, 0, 0, 0, N, 1, 0, 0, 0, 1});
  }
  if (failures == n_before)
    printf("ok   %s conv (2D and 3D, k 1/3/5, stride 1/2, causal zero and replicate, edge-replicated padding, "
           "upsampled input, 5 acts, bias, residual, Ci and Co tails, padded and shifted pixels)\n", sname(s));
}

/* group_norm against the CPU reference: 4D and 5D, groups of 1 to C channels, off-center groups,
   the modulation and act, both load paths (padded pixels), in place */
static void run_gn(fusedk_scalar s, int nd, const int64_t *shape, int groups, int mod, int act, int64_t cpad,
                   int inplace) {
  char what[200];
  snprintf(what, sizeof what, "group_norm %s [%lld,%lld,%lld,%lld%s] groups %d%s act %s cpad %lld%s", sname(s),
           (long long)shape[0], (long long)shape[1], (long long)shape[2], (long long)shape[3], nd == 5 ? ",..." : "",
           groups, mod ? " weight bias scale shift" : "", act_name(act), (long long)cpad, inplace ? " in place" : "");
  const int64_t C = shape[nd - 1], nc[2] = {shape[0], C};
  buf_t x = mk(s, nd, shape, cpad, 0, 0, 2.0, 3.0), w = mk(s, 1, &C, 0, 0, 0, 1.0, 0.0), b = mk(s, 1, &C, 0, 0, 0, 1.0, 0.0);
  buf_t sc = mk(s, 2, nc, 0, 0, 0, 0.2, 0.0), sh = mk(s, 2, nc, 0, 0, 0, 1.0, 0.0), y = mk(s, nd, shape, cpad, 0, 0, 0.0, 0.0);
  buf_t *o = inplace ? &x : &y;
  if (!inplace) poison(&y);
  fusedk_status st[2];
  for (int d = 1; d >= 0; --d) /* the GPU first: in place, the host copy still holds x */
    st[d] = fusedk_group_norm(d ? &o->td : &o->th, d ? &x.td : &x.th, !mod ? NULL : d ? &w.td : &w.th,
                              !mod ? NULL : d ? &b.td : &b.th, !mod ? NULL : d ? &sc.td : &sc.th,
                              !mod ? NULL : d ? &sh.td : &sh.th, groups, 1e-6f, (fusedk_activation)act, NULL);
  if (!call_failed_counted(what, st[0], st[1])) {
    ++checks;
    if (compare(what, o, NULL, 0, eps_of(s), 1)) ++failures;
  }
  drop(&x), drop(&w), drop(&b), drop(&sc), drop(&sh), drop(&y);
}

static void gn_cases(fusedk_scalar s) {
  const int n_before = failures, N = FUSEDK_ACT_NONE, SILU = FUSEDK_ACT_SILU;
  run_gn(s, 4, (int64_t[]){2, 9, 7, 64}, 32, 1, SILU, 0, 0);
  run_gn(s, 4, (int64_t[]){2, 9, 7, 64}, 32, 0, N, 3, 0);   /* padded pixels: the element path */
  run_gn(s, 4, (int64_t[]){1, 5, 5, 24}, 6, 1, SILU, 0, 1); /* in place */
  run_gn(s, 4, (int64_t[]){3, 1, 1, 12}, 12, 1, N, 0, 0);   /* one pixel, a channel a group */
  run_gn(s, 4, (int64_t[]){1, 13, 11, 40}, 1, 0, FUSEDK_ACT_GELU, 0, 0);
  run_gn(s, 5, (int64_t[]){1, 3, 6, 7, 48}, 16, 1, SILU, 0, 0);
  run_gn(s, 4, (int64_t[]){1, 3, 3, 4096}, 32, 1, SILU, 0, 0); /* vectors past one block */
  run_gn(s, 4, (int64_t[]){70000, 1, 2, 8}, 2, 1, SILU, 0, 0);  /* samples past a grid's y (65535) */
  run_gn(s, 4, (int64_t[]){1, 17, 19, 128}, 32, 1, SILU, 0, 1); /* the held form in place */
  run_gn(s, 4, (int64_t[]){3, 21, 23, 96}, 3, 0, N, 0, 0);      /* 12 vectors a pixel: 42 lanes of 512 threads */
  run_gn(s, 4, (int64_t[]){200, 3, 5, 64}, 8, 1, SILU, 0, 0);   /* more samples than SMs: three launches */
  if (!small) {
    run_gn(s, 4, (int64_t[]){1, 192, 192, 512}, 32, 1, SILU, 0, 0); /* past the SMs' shared memory: streamed */
    run_gn(s, 4, (int64_t[]){1, 256, 256, 128}, 32, 1, SILU, 0, 0);
    run_gn(s, 5, (int64_t[]){1, 4, 30, 52, 384}, 32, 1, SILU, 0, 0);
  }
  if (failures == n_before)
    printf("ok   %s group_norm (4D and 5D, 1 to C channels a group, modulation, 3 acts, padded pixels, in place)\n",
           sname(s));
}

/* channel_rmsnorm against the CPU reference: both eps forms, the act, both load paths, the
   per-sample modulation (scale rows strided as chunks of a wider projection) */
static void run_crms(fusedk_scalar s, int nd, const int64_t *shape, int clamp, int act, int64_t cpad, int mod) {
  char what[200];
  snprintf(what, sizeof what, "channel_rmsnorm %s [%lld,...,%lld] clamp %d act %s cpad %lld%s", sname(s),
           (long long)shape[0], (long long)shape[nd - 1], clamp, act_name(act), (long long)cpad,
           mod ? " scale shift" : "");
  const int64_t C = shape[nd - 1], nc[2] = {shape[0], C};
  const float eps = clamp ? (float)(1e-12 / sqrt((double)C)) : 1e-8f;
  buf_t x = mk(s, nd, shape, cpad, 0, 0, 1.0, 0.0), w = mk(s, 1, &C, 0, 0, 0, 1.0, 0.0), b = mk(s, 1, &C, 0, 0, 0, 1.0, 0.0);
  buf_t sc = mk(s, 2, nc, 5, 0, 0, 0.2, 0.0), sh = mk(s, 2, nc, 0, 0, 0, 1.0, 0.0), y = mk(s, nd, shape, cpad, 0, 0, 0.0, 0.0);
  poison(&y);
  fusedk_status st[2];
  for (int d = 0; d < 2; ++d)
    st[d] = fusedk_channel_rmsnorm(d ? &y.td : &y.th, d ? &x.td : &x.th, d ? &w.td : &w.th, d ? &b.td : &b.th,
                                   !mod ? NULL : d ? &sc.td : &sc.th, !mod ? NULL : d ? &sh.td : &sh.th, eps, clamp,
                                   (fusedk_activation)act, NULL);
  if (!call_failed_counted(what, st[0], st[1])) {
    ++checks;
    if (compare(what, &y, NULL, 0, eps_of(s), 1)) ++failures;
  }
  drop(&x), drop(&w), drop(&b), drop(&sc), drop(&sh), drop(&y);
}

static void crms_cases(fusedk_scalar s) {
  const int n_before = failures;
  run_crms(s, 5, (int64_t[]){1, 4, 30, 52, 384}, 1, FUSEDK_ACT_SILU, 0, 0); /* Wan's */
  run_crms(s, 5, (int64_t[]){2, 3, 5, 4, 96}, 0, FUSEDK_ACT_SILU, 0, 0);   /* LTX-Video's */
  run_crms(s, 5, (int64_t[]){3, 3, 5, 4, 128}, 0, FUSEDK_ACT_SILU, 0, 1);  /* LTX's timestep-conditioned */
  run_crms(s, 4, (int64_t[]){1, 7, 5, 96}, 1, FUSEDK_ACT_NONE, 3, 0);      /* padded pixels: the element path */
  run_crms(s, 4, (int64_t[]){2, 3, 3, 2050}, 0, FUSEDK_ACT_GELU, 0, 1);     /* rows past a warp's vectors */
  /* lanes a row: 2 (8 vectors), 8, 32 holding the row, 32 reading it twice */
  run_crms(s, 4, (int64_t[]){2, 3, 5, 64}, 0, FUSEDK_ACT_RELU, 0, 0);
  run_crms(s, 4, (int64_t[]){1, 3, 7, 256}, 1, FUSEDK_ACT_SILU, 0, 1);
  run_crms(s, 4, (int64_t[]){1, 2, 3, 768}, 0, FUSEDK_ACT_SILU, 0, 0);
  run_crms(s, 4, (int64_t[]){1, 3, 3, 1032}, 1, FUSEDK_ACT_GELU_TANH, 0, 1);
  run_crms(s, 2, (int64_t[]){5, 3}, 1, FUSEDK_ACT_SILU, 0, 1);
  if (failures == n_before)
    printf("ok   %s channel_rmsnorm (both eps forms, acts, padded pixels, modulation)\n", sname(s));
}

/* --- units and how they run ------------------------------------------------------------------
   A unit is a family's cases for one dtype or one group. FUSEDK_TEST_ONLY (comma-separated)
   selects units by family, full name or the name's first word (norm, elementwise, position,
   rope, qk_norm_rope, graph, huge, linear, attention, lowrank, "ew_sweep bf16", ...). Several units run as parallel
   processes (this program again, FUSEDK_TEST_UNIT naming the unit): the CPU references of the
   big cases take the machine's cores, each process its own CUDA context on the one device;
   FUSEDK_TEST_JOBS (default: the online cores) caps them, 1 runs every unit in this process
   (compute-sanitizer's runs). Each unit's output is printed whole, in table order. */
typedef struct {
  const char *family, *name;
  void (*run)(fusedk_scalar);
  fusedk_scalar s;
} unit_t;
#define FOR_DTYPES(family, name, fn) \
  {family, name " f32", fn, FUSEDK_F32}, {family, name " f16", fn, FUSEDK_F16}, {family, name " bf16", fn, FUSEDK_BF16}
#define FOR_16BIT(family, name, fn) {family, name " f16", fn, FUSEDK_F16}, {family, name " bf16", fn, FUSEDK_BF16}
static const unit_t units[] = {
    FOR_DTYPES("norm", "norm_sweep", norm_sweep),
    FOR_DTYPES("norm", "norm_far_mean", norm_far_mean),
    FOR_DTYPES("norm", "adaln_modes", adaln_modes),
    FOR_16BIT("norm", "adaln_mod32", adaln_mod32),
    {"norm", "norm_rows", norm_rows, FUSEDK_BF16},
    FOR_DTYPES("elementwise", "ew_sweep", ew_sweep),
    FOR_16BIT("elementwise", "ew_gate32", ew_gate32),
    {"elementwise", "ew_rows act", ew_rows_act, FUSEDK_BF16},
    {"elementwise", "ew_rows silu_fma/gated_residual", ew_rows_fma, FUSEDK_BF16},
    {"elementwise", "ew_rows glu", ew_rows_glu, FUSEDK_BF16},
    {"elementwise", "ew_rows diffusion_step", ew_rows_step, FUSEDK_BF16},
    FOR_DTYPES("position", "rope", rope_cases),
    FOR_DTYPES("position", "qk_norm_rope", qknr_cases),
    {"position", "qk_norm_rope big", qknr_big, FUSEDK_BF16},
    {"position", "rope big", rope_big, FUSEDK_BF16},
    {"graph", "graph", graph_unit, FUSEDK_BF16},
    {"huge", "huge rmsnorm", huge_rmsnorm, FUSEDK_BF16},
    {"huge", "huge silu", huge_silu, FUSEDK_BF16},
    FOR_DTYPES("linear", "linear", linear_cases),
    {"linear", "linear edges", linear_edges, FUSEDK_BF16},
    {"linear", "linear tuned", linear_tuned, FUSEDK_BF16},
    FOR_DTYPES("linear", "quantize_fp8", quant_cases),
    FOR_DTYPES("linear", "glu_fp8", glu_quant_cases),
    FOR_16BIT("linear", "linear_fp8", linear_fp8_cases),
    FOR_DTYPES("linear", "linear_w8", linear_w8_cases),
    FOR_16BIT("attention", "attention", attn_cases), /* the GPU kernels take f16 and bf16 */
    FOR_16BIT("attention", "attention edges", attn_edges),
    FOR_16BIT("attention", "attention big", attn_big),
    FOR_16BIT("attention", "attention int8", attn_i8_cases),
    FOR_16BIT("attention", "attention int8 scaled", attn_scaled_cases),
    FOR_DTYPES("lowrank", "lowrank", lowrank_cases),
    FOR_DTYPES("lowrank", "linear_lowrank", linear_lowrank_cases),
    FOR_DTYPES("lowrank", "lowrank_grad", lowrank_grad_cases),
    FOR_16BIT("conv", "conv", conv_cases), /* the GPU kernel takes f16 and bf16 */
    FOR_DTYPES("conv", "group_norm", gn_cases),
    FOR_DTYPES("conv", "channel_rmsnorm", crms_cases),
};
enum { N_UNITS = sizeof units / sizeof units[0] };

static int selected(const unit_t *u, const char *only) {
  if (!only || !*only) return !small || strcmp(u->family, "huge"); /* the > 2^31-element cases: not small */
  char list[512];
  snprintf(list, sizeof list, "%s", only);
  for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    const size_t first = strcspn(u->name, " ");
    if (!strcmp(tok, u->family) || !strcmp(tok, u->name) || (strlen(tok) == first && !strncmp(tok, u->name, first)))
      return 1;
  }
  return 0;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* the unit in a child process, its stdout and stderr into a temporary file */
static pid_t spawn_unit(const unit_t *u, int fd) {
  static char env_unit[160];
  size_t n = 0;
  while (environ[n]) ++n;
  char **env = calloc(n + 2, sizeof *env);
  size_t k = 0;
  for (size_t i = 0; i < n; ++i)
    if (strncmp(environ[i], "FUSEDK_TEST_UNIT=", 17)) env[k++] = environ[i];
  snprintf(env_unit, sizeof env_unit, "FUSEDK_TEST_UNIT=%s", u->name);
  env[k++] = env_unit;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fd, 1);
  posix_spawn_file_actions_adddup2(&fa, fd, 2);
  char exe[] = "/proc/self/exe", *argv[] = {exe, NULL};
  pid_t pid = -1;
  if (posix_spawn(&pid, exe, &fa, NULL, argv, env)) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  free(env);
  return pid;
}

/* every selected unit in up to `jobs` processes at once; then each one's output in order, its
   wall time, and the counts summed from its last line */
static void run_parallel(const int *sel, int n, int jobs) {
  pid_t pid[N_UNITS];
  int fd[N_UNITS], status[N_UNITS], running = 0, next = 0, done = 0;
  double t0[N_UNITS], t1[N_UNITS];
  while (done < n) {
    while (running < jobs && next < n) {
      char path[] = "/tmp/fusedk-test-gpu-XXXXXX";
      fd[next] = mkstemp(path);
      if (fd[next] < 0) perror("mkstemp"), exit(1);
      unlink(path); /* read back through the descriptor */
      t0[next] = now_s();
      pid[next] = spawn_unit(&units[sel[next]], fd[next]);
      if (pid[next] < 0) printf("FAIL %s: could not start its process\n", units[sel[next]].name), exit(1);
      ++running, ++next;
    }
    int st;
    const pid_t p = wait(&st);
    if (p < 0) break;
    for (int i = 0; i < next; ++i)
      if (pid[i] == p) status[i] = st, t1[i] = now_s(), pid[i] = 0, --running, ++done;
  }
  for (int i = 0; i < n; ++i) {
    const unit_t *u = &units[sel[i]];
    char line[1024];
    int passed = -1, failed = -1;
    FILE *f = fdopen(fd[i], "r");
    rewind(f);
    while (fgets(line, sizeof line, f)) {
      if (sscanf(line, "%d passed, %d failed", &passed, &failed) == 2) continue;
      if (strncmp(line, "device: ", 8)) fputs(line, stdout);
    }
    fclose(f);
    const int clean = WIFEXITED(status[i]) && WEXITSTATUS(status[i]) <= 1 && passed >= 0;
    if (!clean) {
      const int sig = WIFSIGNALED(status[i]);
      printf("FAIL %s: its process ended without a count (%s %d)\n", u->name,
             sig ? "signal" : "exit code", sig ? WTERMSIG(status[i]) : WEXITSTATUS(status[i]));
      ++checks, ++failures;
    } else {
      checks += passed + failed, failures += failed;
    }
    printf("     %-34s %6.1f s\n", u->name, t1[i] - t0[i]);
  }
}

int main(void) {
  if (fusedk_cuda_device_count() == 0) {
    printf("SKIP: no CUDA device (fusedk_cuda_device_count() == 0)\n");
    return 77;
  }
  struct cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  printf("device: %s (sm_%d%d, %d SMs)\n", p.name, p.major, p.minor, p.multiProcessorCount);
  small = getenv("FUSEDK_TEST_SMALL") && atoi(getenv("FUSEDK_TEST_SMALL"));
  const char *unit = getenv("FUSEDK_TEST_UNIT"), *only = getenv("FUSEDK_TEST_ONLY");
  int sel[N_UNITS], n = 0;
  for (int i = 0; i < N_UNITS; ++i)
    if (unit ? !strcmp(units[i].name, unit) : selected(&units[i], only)) sel[n++] = i;
  if (n == 0) {
    printf("FUSEDK_TEST_%s=%s names no unit; families: norm, elementwise, position, graph, huge, linear, attention, conv, "
           "lowrank; units:",
           unit ? "UNIT" : "ONLY", unit ? unit : only);
    for (int i = 0; i < N_UNITS; ++i) printf("%s %s", i ? "," : "", units[i].name);
    printf("\n");
    return 2;
  }
  if (small && !unit) printf("small cases only (FUSEDK_TEST_SMALL)\n");
  const char *j = getenv("FUSEDK_TEST_JOBS");
  long jobs = j ? atol(j) : sysconf(_SC_NPROCESSORS_ONLN);
  const double t0 = now_s();
  if (unit || n == 1 || jobs <= 1) {
    for (int i = 0; i < n; ++i) units[sel[i]].run(units[sel[i]].s);
  } else {
    fflush(stdout);
    run_parallel(sel, n, (int)(jobs < n ? jobs : n));
  }
  fusedk_shutdown(); /* what the linear ops keep: released, so a leak check sees none */
  if (!unit) printf("%d units in %.1f s\n", n, now_s() - t0);
  printf("%d passed, %d failed\n", checks - failures, failures);
  return failures ? 1 : 0;
}
