/* Bad input for every argument of every op: the status, a reason naming the argument, and
   outputs left untouched. Plus the library basics (version, status names, kernel_info) and the
   shape of every op's every output (fusedk_op_out_shape). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fusedk.h"

static int failures = 0, checks = 0;
#define EXPECT(cond, ...)                                   \
  do {                                                      \
    ++checks;                                               \
    if (!(cond)) {                                          \
      ++failures;                                           \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);           \
      printf(__VA_ARGS__);                                  \
      printf("\n");                                         \
    }                                                       \
  } while (0)

enum { B = 2, L = 3, D = 8, N = B * L * D };
static float bx[N], bres[N], by[N], bro[N], bw[D], bb[D], bsc[B * 6 * D], bsh[B * D], bg[B * D];
static int64_t s3[3] = {B, L, D}, s2[2] = {B, D}, s1[1] = {D};

/* every op call of this file: one set of tensors, each case mutates one argument */
typedef struct {
  fusedk_tensor x, y, res, ro, w, bias, scale, shift, gate;
  int use_res, use_ro, use_w, use_bias, norm, exact;
  float eps;
} call_t;

static void fresh(call_t *c) {
  memset(c, 0, sizeof *c);
  c->x = fusedk_tensor_cpu(bx, FUSEDK_F32, 3, s3);
  c->y = fusedk_tensor_cpu(by, FUSEDK_F32, 3, s3);
  c->res = fusedk_tensor_cpu(bres, FUSEDK_F32, 3, s3);
  c->ro = fusedk_tensor_cpu(bro, FUSEDK_F32, 3, s3);
  c->w = fusedk_tensor_cpu(bw, FUSEDK_F32, 1, s1);
  c->bias = fusedk_tensor_cpu(bb, FUSEDK_F32, 1, s1);
  c->scale = fusedk_tensor_cpu(bsc, FUSEDK_F32, 2, s2);
  c->shift = fusedk_tensor_cpu(bsh, FUSEDK_F32, 2, s2);
  c->gate = fusedk_tensor_cpu(bg, FUSEDK_F32, 2, s2);
  c->use_res = c->use_ro = c->use_w = 1;
  c->eps = 1e-6f;
}

typedef enum { OP_RMS, OP_RMS_RES, OP_LN, OP_ADALN, OP_MOCHI } op_t;
static const char *op_names[] = {"rmsnorm", "rmsnorm", "layernorm", "adaln", "residual_tanh_gated_rmsnorm"};

static fusedk_status run(op_t op, call_t *c, const fusedk_tensor *x, const fusedk_tensor *y) {
  switch (op) {
    case OP_RMS: return fusedk_rmsnorm(y, NULL, x, NULL, c->use_w ? &c->w : NULL, c->eps, NULL);
    case OP_RMS_RES:
      return fusedk_rmsnorm(y, c->use_ro ? &c->ro : NULL, x, c->use_res ? &c->res : NULL, c->use_w ? &c->w : NULL,
                            c->eps, NULL);
    case OP_LN: return fusedk_layernorm(y, x, c->use_w ? &c->w : NULL, c->use_bias ? &c->bias : NULL, c->eps, NULL);
    case OP_ADALN:
      return fusedk_adaln(y, x, &c->scale, &c->shift, (fusedk_norm)c->norm, c->use_w ? &c->w : NULL,
                          c->use_bias ? &c->bias : NULL, c->eps, NULL);
    case OP_MOCHI: return fusedk_residual_tanh_gated_rmsnorm(y, x, &c->res, &c->gate, c->eps, c->exact, NULL);
  }
  return FUSEDK_OK;
}

static const float SENTINEL = 1234.5f;
static void poison(void) {
  for (int i = 0; i < N; ++i) by[i] = bro[i] = SENTINEL;
}
static int untouched(void) {
  for (int i = 0; i < N; ++i)
    if (by[i] != SENTINEL || bro[i] != SENTINEL) return 0;
  return 1;
}

/* runs one bad call and checks status, reason and outputs */
static void bad(op_t op, call_t *c, const fusedk_tensor *x, const fusedk_tensor *y, fusedk_status want,
                const char *needle, const char *what) {
  poison();
  fusedk_status st = run(op, c, x, y);
  const char *r = fusedk_failure_reason();
  EXPECT(st == want, "%s / %s: got %s, expected %s (%s)", op_names[op], what, fusedk_status_name(st),
         fusedk_status_name(want), r);
  EXPECT(strstr(r, op_names[op]) == r, "%s / %s: reason does not start with the op: '%s'", op_names[op], what, r);
  EXPECT(strstr(r, needle) != NULL, "%s / %s: reason lacks '%s': '%s'", op_names[op], what, needle, r);
  EXPECT(untouched(), "%s / %s: an output was written", op_names[op], what);
}

static void cases_for(op_t op) {
  call_t c;
  int64_t bad3[3] = {B, L, D - 1}, bad2[2] = {B, D + 1}, bad1[1] = {D - 1}, s4[4] = {B, L, 1, D};
  int64_t str_last[3] = {L * D * 2, D * 2, 2}, zero_rows[3] = {0, D, 1};
  /* the good call passes */
  fresh(&c);
  c.use_bias = op == OP_LN || op == OP_ADALN;
  poison();
  fusedk_status st = run(op, &c, &c.x, &c.y);
  EXPECT(st == FUSEDK_OK, "%s good call: %s %s", op_names[op], fusedk_status_name(st), fusedk_failure_reason());
  fusedk_tensor t;

  fresh(&c);
  bad(op, &c, NULL, &c.y, FUSEDK_ERR_INVALID_ARGUMENT, "x is NULL", "x NULL");
  bad(op, &c, &c.x, NULL, FUSEDK_ERR_INVALID_ARGUMENT, "y is NULL", "y NULL");
  t = c.x; t.dtype.bits = 64;
  bad(op, &c, &t, &c.y, FUSEDK_ERR_DTYPE, "x has dtype", "x f64");
  t = c.x; t.dtype.lanes = 2;
  bad(op, &c, &t, &c.y, FUSEDK_ERR_DTYPE, "x has dtype", "x lanes");
  t = c.y; t.dtype = fusedk_dtype_of(FUSEDK_BF16);
  bad(op, &c, &c.x, &t, FUSEDK_ERR_DTYPE, "y has dtype bfloat16, expected float32", "y dtype");
  t = c.y; t.shape = bad3;
  bad(op, &c, &c.x, &t, FUSEDK_ERR_SHAPE, "y has shape [2, 3, 7], expected [2, 3, 8]", "y shape");
  t = c.y; t.ndim = 0;
  bad(op, &c, &c.x, &t, FUSEDK_ERR_SHAPE, "y has ndim 0", "y ndim");
  t = c.y; t.device.device_type = FUSEDK_DEVICE_CUDA;
  bad(op, &c, &c.x, &t, FUSEDK_ERR_DEVICE, "y is on device (2, 0)", "y device");
  t = c.x; t.device.device_type = 7;
  bad(op, &c, &t, &c.y, FUSEDK_ERR_DEVICE, "x is on device type 7", "x device type");
  t = c.x; t.strides = str_last;
  bad(op, &c, &t, &c.y, FUSEDK_ERR_LAYOUT, "x has stride 2 in its last dim", "x last stride");
  t = c.x; t.byte_offset = 2;
  bad(op, &c, &t, &c.y, FUSEDK_ERR_LAYOUT, "x data+byte_offset is not aligned", "x misaligned");
  t = c.y; t.strides = zero_rows;
  bad(op, &c, &c.x, &t, FUSEDK_ERR_LAYOUT, "output y has stride 0 in dim 0", "y broadcast");
  t = c.x; t.data = NULL;
  bad(op, &c, &t, &c.y, FUSEDK_ERR_INVALID_ARGUMENT, "x has NULL data", "x data NULL");
  c.eps = -1.0f;
  bad(op, &c, &c.x, &c.y, FUSEDK_ERR_INVALID_ARGUMENT, "eps is -1", "eps negative");
  c.eps = NAN;
  bad(op, &c, &c.x, &c.y, FUSEDK_ERR_INVALID_ARGUMENT, "eps is nan", "eps nan");
  c.eps = INFINITY;
  bad(op, &c, &c.x, &c.y, FUSEDK_ERR_INVALID_ARGUMENT, "eps is inf", "eps inf");
  fresh(&c);
  t = c.x; t.shape = zero_rows; /* last dim 0 */
  {
    int64_t z[3] = {B, L, 0};
    t.shape = z;
    t.strides = NULL;
    fusedk_tensor ty = c.y;
    ty.shape = z;
    bad(op, &c, &t, &ty, FUSEDK_ERR_SHAPE, "x has last dim 0", "D = 0");
  }
  if (op == OP_ADALN || op == OP_MOCHI) {
    t = c.x; t.ndim = 4; t.shape = s4;
    fusedk_tensor ty = c.y; ty.ndim = 4; ty.shape = s4;
    bad(op, &c, &t, &ty, FUSEDK_ERR_SHAPE, "x has ndim 4, expected 3", "x ndim");
  }
  if (op == OP_RMS || op == OP_RMS_RES || op == OP_LN || op == OP_ADALN) {
    fresh(&c);
    c.w.shape = bad1;
    bad(op, &c, &c.x, &c.y, FUSEDK_ERR_SHAPE, "weight has shape [7], expected [8] (last dim of x)", "weight shape");
    fresh(&c);
    c.w.dtype = fusedk_dtype_of(FUSEDK_F16);
    bad(op, &c, &c.x, &c.y, FUSEDK_ERR_DTYPE, "weight has dtype float16", "weight dtype");
  }
  if (op == OP_RMS) { /* a 4-d x whose leading dims cannot flatten to two levels */
    fresh(&c);
    int64_t sh[4] = {2, 2, 2, D}, st[4] = {64 * D, 8 * D, 2 * D, 1};
    fusedk_tensor tx = c.x, ty = c.y;
    tx.ndim = ty.ndim = 4;
    tx.shape = ty.shape = sh;
    tx.strides = st;
    bad(op, &c, &tx, &ty, FUSEDK_ERR_LAYOUT, "leading dims of x", "unflattenable");
  }
  if (op == OP_RMS_RES) {
    fresh(&c);
    c.res.shape = bad3;
    bad(op, &c, &c.x, &c.y, FUSEDK_ERR_SHAPE, "residual has shape [2, 3, 7]", "residual shape");
    fresh(&c);
    c.ro.dtype = fusedk_dtype_of(FUSEDK_BF16);
    bad(op, &c, &c.x, &c.y, FUSEDK_ERR_DTYPE, "residual_out has dtype bfloat16", "residual_out dtype");
    fresh(&c);
    c.ro.strides = zero_rows;
    bad(op, &c, &c.x, &c.y, FUSEDK_ERR_LAYOUT, "output residual_out has stride 0", "residual_out broadcast");
    fresh(&c);
    c.use_res = 0;
    bad(op, &c, &c.x, &c.y, FUSEDK_ERR_INVALID_ARGUMENT, "residual_out is given but residual is NULL", "ro w/o res");
    fresh(&c);
    c.res.device.device_id = 1;
    c.res.device.device_type = FUSEDK_DEVICE_CUDA;
    bad(op, &c, &c.x, &c.y, FUSEDK_ERR_DEVICE, "residual is on device (2, 1)", "residual device");
  }
  if (op == OP_LN || op == OP_ADALN) {
    fresh(&c);
    c.use_bias = 1;
    c.bias.shape = bad1;
    bad(op, &c, &c.x, &c.y, FUSEDK_ERR_SHAPE, "bias has shape [7]", "bias shape");
    fresh(&c);
    c.use_bias = 1;
    c.bias.strides = bad1; /* stride 7 in its (only, last) dim */
    bad(op, &c, &c.x, &c.y, FUSEDK_ERR_LAYOUT, "bias has stride 7 in its last dim", "bias stride");
  }
  if (op == OP_ADALN) {
    fresh(&c);
    c.scale.shape = bad2;
    bad(op, &c, &c.x, &c.y, FUSEDK_ERR_SHAPE, "scale has shape [2, 9], expected [2, 8] ([B, D] of x)", "scale shape");
    fresh(&c);
    c.shift.ndim = 1; c.shift.shape = s1;
    bad(op, &c, &c.x, &c.y, FUSEDK_ERR_SHAPE, "shift has shape [8], expected [2, 8]", "shift ndim");
    fresh(&c);
    c.shift.dtype = fusedk_dtype_of(FUSEDK_F16);
    bad(op, &c, &c.x, &c.y, FUSEDK_ERR_DTYPE, "shift has dtype float16", "shift dtype");
    fresh(&c);
    c.norm = 7;
    bad(op, &c, &c.x, &c.y, FUSEDK_ERR_INVALID_ARGUMENT, "norm is 7", "norm flag");
    fresh(&c);
    c.norm = FUSEDK_NORM_RMS; c.use_bias = 1;
    bad(op, &c, &c.x, &c.y, FUSEDK_ERR_INVALID_ARGUMENT, "bias is given with FUSEDK_NORM_RMS", "rms bias");
    /* a scale view into a [B, 6D] modulation tensor (row stride 6D) is accepted */
    fresh(&c);
    int64_t mod_strides[2] = {6 * D, 1};
    c.scale.strides = mod_strides;
    c.scale.byte_offset = 2 * D * sizeof(float);
    poison();
    st = run(op, &c, &c.x, &c.y);
    EXPECT(st == FUSEDK_OK && !untouched(), "adaln strided scale view: %s %s", fusedk_status_name(st),
           fusedk_failure_reason());
    /* 16-bit rows take a float32 scale and shift (both), or both in their own dtype */
    fresh(&c);
    c.x.dtype = c.y.dtype = fusedk_dtype_of(FUSEDK_BF16);
    c.use_w = 0;
    poison();
    st = run(op, &c, &c.x, &c.y);
    EXPECT(st == FUSEDK_OK && !untouched(), "adaln bf16 rows, float32 scale and shift: %s %s", fusedk_status_name(st),
           fusedk_failure_reason());
    c.shift.dtype = fusedk_dtype_of(FUSEDK_BF16);
    bad(op, &c, &c.x, &c.y, FUSEDK_ERR_DTYPE, "shift has dtype bfloat16, expected float32 (the dtype of scale)",
        "mixed modulation dtypes");
    c.scale.dtype = fusedk_dtype_of(FUSEDK_F16);
    bad(op, &c, &c.x, &c.y, FUSEDK_ERR_DTYPE, "scale has dtype float16, expected bfloat16 (the dtype of x) or float32",
        "scale f16 beside bf16 rows");
  }
  if (op == OP_MOCHI) {
    fresh(&c);
    c.gate.shape = bad2;
    bad(op, &c, &c.x, &c.y, FUSEDK_ERR_SHAPE, "gate has shape [2, 9]", "gate shape");
    fresh(&c);
    c.res.shape = bad3;
    bad(op, &c, &c.x, &c.y, FUSEDK_ERR_SHAPE, "x_res has shape [2, 3, 7]", "x_res shape");
    fresh(&c);
    c.exact = 2;
    bad(op, &c, &c.x, &c.y, FUSEDK_ERR_INVALID_ARGUMENT, "exact is 2", "exact flag");
  }
}

/* The op registry: every op is there under its C name, fusedk_op_call runs it with the
   registry's argument order, and bad ids or arguments fail cleanly. */
static void registry_cases(void) {
  const char *names[FUSEDK_OP_COUNT] = {"rmsnorm", "layernorm", "adaln", "residual_tanh_gated_rmsnorm", "act",
                                        "silu_fma", "gated_residual", "glu", "glu_pair", "rope", "rope_table_1d",
                                        "rope_table_axes", "rope_table_ltx", "rope_table_mixed", "diffusion_step",
                                        "qk_norm_rope", "linear", "linear_backward", "attention",
                                        "lowrank_update", "lowrank_prepare", "linear_lowrank",
                                        "lowrank_update_backward", "linear_lowrank_backward", "attention_int8",
                                        "attention_int8_scaled", "qk_norm_rope_int8", "quantize_fp8",
                                        "dequantize_fp8", "linear_fp8", "rmsnorm_fp8", "layernorm_fp8",
                                        "adaln_fp8", "glu_fp8", "quantize_int8", "linear_w8", "conv",
                                        "fold_batchnorm", "group_norm", "channel_rmsnorm"};
  for (int i = 0; i < FUSEDK_OP_COUNT; ++i) {
    const fusedk_op *o = fusedk_op_get(i);
    EXPECT(o && !strcmp(o->name, names[i]) && fusedk_op_find(names[i]) == i, "registry entry %d", i);
    EXPECT(o && o->n_tensors <= FUSEDK_OP_MAX_TENSORS && o->n_attrs <= FUSEDK_OP_MAX_ATTRS, "registry sizes %d", i);
    for (int k = 0; o && k < o->n_tensors; ++k) {
      const fusedk_op_tensor *t = &o->tensors[k];
      int out = t->kind >= FUSEDK_ARG_OUT;
      EXPECT(!out || (t->like >= 0 && t->like < o->n_tensors &&
                      (o->tensors[t->like].kind == FUSEDK_ARG_IN || (o->tensors[t->like].kind == FUSEDK_ARG_IN_OPT &&
                                                                     t->when == t->like))),
             "%s: output %s copies an input that exists whenever it does", o->name, t->name);
      EXPECT(t->scalar == -1 || t->scalar == FUSEDK_F32 ||
                 (t->scalar == -2 && t->kind == FUSEDK_ARG_IN && t->role == FUSEDK_ROLE_SAMPLE) ||
                 (t->scalar == FUSEDK_I32 && t->kind <= FUSEDK_ARG_IN_OPT && t->role == FUSEDK_ROLE_OWN) ||
                 (t->scalar == FUSEDK_I8 && (t->role == FUSEDK_ROLE_OWN || t->role == FUSEDK_ROLE_ROW)) ||
                 (t->scalar == FUSEDK_E4M3 && (t->role == FUSEDK_ROLE_OWN || t->role == FUSEDK_ROLE_ROW ||
                                                 t->role == FUSEDK_ROLE_ROW_HALF)) ||
                 (t->scalar == -3 && fusedk_op_out_scalar(i, k, NULL) == -1),
             "%s: %s has the call's dtype, float32, (a per-sample input) either, (an index input) int32, (a "
             "scaled tensor's data) int8 or e4m3, or out_dtype's",
             o->name, t->name);
      EXPECT(t->kind != FUSEDK_ARG_OUT_OPT || (t->when >= 0 && o->tensors[t->when].kind == FUSEDK_ARG_IN_OPT) ||
                 (t->when <= -2 && -2 - t->when < o->n_attrs),
             "%s: optional output %s depends on an optional input or an attribute", o->name, t->name);
      EXPECT(t->role >= FUSEDK_ROLE_ROW && t->role <= FUSEDK_ROLE_ROW_SCALE &&
             (!out || t->role != FUSEDK_ROLE_COLUMN) && (t->role != FUSEDK_ROLE_ROW_SCALE || t->scalar == FUSEDK_F32) &&
             (t->role != FUSEDK_ROLE_SAMPLE || o->row_ndim == 3), "%s: %s has a valid role", o->name, t->name);
    }
    int ref = -1; /* the reference the error messages name: the first required input of the call's dtype */
    for (int k = 0; o && k < o->n_tensors && (ref < 0 || o->tensors[ref].scalar >= 0); ++k)
      if (o->tensors[k].kind == FUSEDK_ARG_IN && (ref < 0 || o->tensors[k].scalar < 0)) ref = k;
    if (ref < 0) ref = o ? o->n_tensors : 0;
    EXPECT(o && ref < o->n_tensors && (o->row_ndim < 0 || o->tensors[ref].role == FUSEDK_ROLE_ROW),
           "%s: its reference tensor is a required row input (ops with rows)", names[i]);
  }
  EXPECT(!fusedk_op_get(-1) && !fusedk_op_get(FUSEDK_OP_COUNT) && fusedk_op_find("nope") == -1, "registry bounds");
  { /* output shapes: what every binding allocates */
    int64_t xs[3] = {2, 3, 16}, ps[1] = {7}, fs[3] = {3, 4, 10}, shape[FUSEDK_MAX_DIMS];
    fusedk_tensor x = fusedk_tensor_cpu(NULL, FUSEDK_F32, 3, xs), p = fusedk_tensor_cpu(NULL, FUSEDK_F32, 1, ps);
    fusedk_tensor f = fusedk_tensor_cpu(NULL, FUSEDK_F32, 3, fs);
    const fusedk_tensor *glu[2] = {NULL, &x}, *tab[3] = {NULL, NULL, &p}, *mix[4] = {NULL, NULL, &p, &f};
    const double g_a[2] = {2, 0}, t_a[2] = {64, 1e4}, ax_a[5] = {1e4, 16, 56, 56, 0}, bad_a[2] = {63, 1e4};
    int nd = fusedk_op_out_shape(FUSEDK_OP_GLU, 0, glu, g_a, shape);
    EXPECT(nd == 3 && shape[0] == 2 && shape[1] == 3 && shape[2] == 8, "out_shape glu: %d", nd);
    nd = fusedk_op_out_shape(FUSEDK_OP_ROPE_TABLE_1D, 1, tab, t_a, shape);
    EXPECT(nd == 2 && shape[0] == 7 && shape[1] == 32, "out_shape rope_table_1d: %d", nd);
    nd = fusedk_op_out_shape(FUSEDK_OP_ROPE_TABLE_AXES, 0, tab, ax_a, shape);
    EXPECT(nd == 2 && shape[0] == 7 && shape[1] == 64, "out_shape rope_table_axes: %d", nd);
    nd = fusedk_op_out_shape(FUSEDK_OP_ROPE_TABLE_MIXED, 0, mix, t_a, shape);
    EXPECT(nd == 3 && shape[0] == 7 && shape[1] == 4 && shape[2] == 10, "out_shape rope_table_mixed: %d", nd);
    nd = fusedk_op_out_shape(FUSEDK_OP_ROPE_TABLE_LTX, 0, tab, bad_a, shape);
    EXPECT(nd == -FUSEDK_ERR_INVALID_ARGUMENT && strstr(fusedk_failure_reason(), "rope_table_ltx: dim is 63, expected an even size"),
           "out_shape: an odd dim: %s", fusedk_failure_reason());
    { /* linear_lowrank_backward: db like b ([A,] N, r from a's [A,] r, K and w_cat's N), dbias [N] */
      int64_t as3[3] = {4, 6, 16}, wcs[2] = {9, 16 + 32};
      fusedk_tensor a3 = fusedk_tensor_cpu(NULL, FUSEDK_F32, 3, as3), wc = fusedk_tensor_cpu(NULL, FUSEDK_F32, 2, wcs);
      const fusedk_tensor *lg[12] = {NULL, NULL, NULL, NULL, NULL, NULL, &x, &wc, &a3, NULL, NULL, NULL};
      const double lg_a[6] = {FUSEDK_ACT_NONE, 1, 1, 1, 1, 1};
      nd = fusedk_op_out_shape(FUSEDK_OP_LINEAR_LOWRANK_BACKWARD, 2, lg, lg_a, shape);
      EXPECT(nd == 3 && shape[0] == 4 && shape[1] == 9 && shape[2] == 6, "out_shape linear_lowrank_backward db: %d", nd);
      nd = fusedk_op_out_shape(FUSEDK_OP_LINEAR_LOWRANK_BACKWARD, 4, lg, lg_a, shape);
      EXPECT(nd == 1 && shape[0] == 9, "out_shape linear_lowrank_backward dbias: %d", nd);
    }
    { /* qk_norm_rope: each output in the layout attribute's order */
      int64_t qs[4] = {2, 5, 6, 8}, ks[4] = {2, 5, 3, 8};
      fusedk_tensor q = fusedk_tensor_cpu(NULL, FUSEDK_F32, 4, qs), k = fusedk_tensor_cpu(NULL, FUSEDK_F32, 4, ks);
      const fusedk_tensor *qk[10] = {NULL, NULL, NULL, &q, &k, &k};
      double la[5] = {1e-6, FUSEDK_QK_NORM_HEAD, FUSEDK_ROPE_INTERLEAVED, FUSEDK_LAYOUT_BHSD, 0};
      nd = fusedk_op_out_shape(FUSEDK_OP_QK_NORM_ROPE, 1, qk, la, shape);
      EXPECT(nd == 4 && shape[0] == 2 && shape[1] == 3 && shape[2] == 5 && shape[3] == 8, "out_shape qk_norm_rope bhsd");
      la[3] = FUSEDK_LAYOUT_BSHD;
      nd = fusedk_op_out_shape(FUSEDK_OP_QK_NORM_ROPE, 0, qk, la, shape);
      EXPECT(nd == 4 && shape[0] == 2 && shape[1] == 5 && shape[2] == 6 && shape[3] == 8, "out_shape qk_norm_rope bshd");
      la[3] = 7;
      nd = fusedk_op_out_shape(FUSEDK_OP_QK_NORM_ROPE, 2, qk, la, shape);
      EXPECT(nd == -FUSEDK_ERR_INVALID_ARGUMENT && strstr(fusedk_failure_reason(), "qk_norm_rope: layout is 7"),
             "out_shape qk_norm_rope: a bad layout: %s", fusedk_failure_reason());
    }
    { /* linear: y and aux_out are x's rows of N (w's first dim), db [N]; aux_out exists when asked */
      int64_t ls[3] = {2, 3, 16}, ws[2] = {5, 16};
      fusedk_tensor lx = fusedk_tensor_cpu(NULL, FUSEDK_F32, 3, ls), lw = fusedk_tensor_cpu(NULL, FUSEDK_F32, 2, ws);
      const fusedk_tensor *rr[5] = {NULL, NULL, &lx, &lx, NULL}, *lin[5] = {NULL, NULL, &lx, &lw, NULL}, *bwd[7] = {NULL, NULL, NULL, &lx, &lx, &lw, NULL};
      const double la[3] = {FUSEDK_ACT_NONE, 0, 0}, lb[5] = {FUSEDK_ACT_NONE, 0, 1, 0, 1};
      nd = fusedk_op_out_shape(FUSEDK_OP_LINEAR, 1, lin, la, shape);
      EXPECT(nd == 3 && shape[0] == 2 && shape[1] == 3 && shape[2] == 5, "out_shape linear aux_out: %d", nd);
      nd = fusedk_op_out_shape(FUSEDK_OP_LINEAR_BACKWARD, 2, bwd, lb, shape);
      EXPECT(nd == 1 && shape[0] == 5, "out_shape linear_backward db: %d", nd);
      nd = fusedk_op_out_shape(FUSEDK_OP_LINEAR_BACKWARD, 1, bwd, lb, shape);
      EXPECT(nd == 2 && shape[0] == 5 && shape[1] == 16, "out_shape linear_backward dw: %d", nd);
      EXPECT(fusedk_op_out_exists(FUSEDK_OP_LINEAR, 0, lin, la) && !fusedk_op_out_exists(FUSEDK_OP_LINEAR, 1, lin, la) &&
             fusedk_op_out_exists(FUSEDK_OP_LINEAR_BACKWARD, 0, bwd, lb) &&
             !fusedk_op_out_exists(FUSEDK_OP_LINEAR_BACKWARD, 1, bwd, lb) &&
             fusedk_op_out_exists(FUSEDK_OP_LINEAR_BACKWARD, 2, bwd, lb) &&
             !fusedk_op_out_exists(FUSEDK_OP_LINEAR_BACKWARD, 3, bwd, lb) &&
             fusedk_op_out_exists(FUSEDK_OP_RMSNORM, 1, rr, la) &&
             !fusedk_op_out_exists(FUSEDK_OP_RMSNORM, 1, rr + 1, la), "out_exists");
    }
    nd = fusedk_op_out_shape(FUSEDK_OP_GLU, 1, glu, g_a, shape);
    EXPECT(nd == -FUSEDK_ERR_INVALID_ARGUMENT && strstr(fusedk_failure_reason(), "not an output"), "out_shape: an input: %s",
           fusedk_failure_reason());
  }
  call_t c;
  fresh(&c);
  poison();
  const fusedk_tensor *t[5] = {&c.y, &c.ro, &c.x, &c.res, &c.w};
  const double a[1] = {1e-6};
  fusedk_status st = fusedk_op_call(FUSEDK_OP_RMSNORM, t, a, NULL);
  EXPECT(st == FUSEDK_OK && by[0] != SENTINEL && bro[0] == bx[0] + bres[0], "op_call rmsnorm: %s",
         fusedk_failure_reason());
  st = fusedk_op_call(FUSEDK_OP_COUNT, t, a, NULL);
  EXPECT(st == FUSEDK_ERR_INVALID_ARGUMENT && strstr(fusedk_failure_reason(), "op_call: op"), "op_call bad id");
  const fusedk_tensor *none[FUSEDK_OP_MAX_TENSORS] = {0};
  const double frac[2] = {2.5, 1e-6}, nan_attr[1] = {NAN};
  st = fusedk_op_call(FUSEDK_OP_ADALN, none, frac, NULL);
  EXPECT(st == FUSEDK_ERR_INVALID_ARGUMENT && strstr(fusedk_failure_reason(), "adaln: attribute norm is 2.5, expected an integer"),
         "op_call: a fractional integer attribute: %s", fusedk_failure_reason());
  st = fusedk_op_call(FUSEDK_OP_ACT, none, nan_attr, NULL);
  EXPECT(st == FUSEDK_ERR_INVALID_ARGUMENT && strstr(fusedk_failure_reason(), "act: attribute kind is nan"),
         "op_call: a NaN integer attribute: %s", fusedk_failure_reason());
  st = fusedk_op_call(FUSEDK_OP_RMSNORM, NULL, a, NULL);
  EXPECT(st == FUSEDK_ERR_INVALID_ARGUMENT && strstr(fusedk_failure_reason(), "rmsnorm"), "op_call NULL tensors");
  char info[4096];
  fusedk_kernel_info(info, sizeof info);
  for (int i = 0; i < FUSEDK_OP_COUNT; ++i) EXPECT(strstr(info, names[i]) != NULL, "kernel_info lists %s", names[i]);
}

/* Empty tensors (NumPy gives them strides of 0) are fine and write nothing; unsupported dtypes
   are named, not coded. */
static void empty_and_dtype_cases(void) {
  int64_t e2[2] = {0, D}, zero_st[2] = {0, 0};
  call_t c;
  fresh(&c);
  c.x = fusedk_tensor_cpu(bx, FUSEDK_F32, 2, e2);
  c.y = fusedk_tensor_cpu(by, FUSEDK_F32, 2, e2);
  c.x.strides = c.y.strides = zero_st;
  poison();
  fusedk_status st = fusedk_rmsnorm(&c.y, NULL, &c.x, NULL, &c.w, 1e-6f, NULL);
  EXPECT(st == FUSEDK_OK && untouched(), "empty [0, D] with zero strides: %s", fusedk_failure_reason());
  const struct { uint8_t code, bits; uint16_t lanes; const char *name; } dts[] = {
      {FUSEDK_DTYPE_FLOAT, 64, 1, "float64"}, {FUSEDK_DTYPE_INT, 32, 1, "int32"}, {FUSEDK_DTYPE_UINT, 8, 1, "uint8"},
      {6, 8, 1, "bool"}, {5, 64, 1, "complex64"}, {FUSEDK_DTYPE_FLOAT, 16, 2, "float16x2"}};
  for (size_t i = 0; i < sizeof dts / sizeof dts[0]; ++i) {
    fresh(&c);
    c.x.dtype.code = dts[i].code, c.x.dtype.bits = dts[i].bits, c.x.dtype.lanes = dts[i].lanes;
    bad(OP_RMS, &c, &c.x, &c.y, FUSEDK_ERR_DTYPE, dts[i].name, "dtype named");
  }
}

/* What the fuzzer (tests/fuzz) found: sizes whose product overflows, an input without its
   output, a non-integer attribute given to the shape rule, a GEMM over K = 0 without data. */
static void fuzz_findings(void) {
  float a[16] = {0}, y[16];
  int64_t huge[3] = {(int64_t)1 << 40, (int64_t)1 << 40, 0}, s2[2] = {2, 8};
  fusedk_tensor x = fusedk_tensor_cpu(a, FUSEDK_F32, 3, huge), ty = x;
  ty.data = y;
  fusedk_status st = fusedk_act(&ty, &x, FUSEDK_ACT_GELU, NULL);
  EXPECT(st == FUSEDK_ERR_SHAPE && strstr(fusedk_failure_reason(), "act: x has shape [1099511627776, "
                                                                    "1099511627776, 0], sizes whose product passes 2^59"),
         "huge sizes: %s %s", fusedk_status_name(st), fusedk_failure_reason());
  int64_t far[3] = {(int64_t)1 << 50, 1, 1}, s3[3] = {1024, 2, 8};
  x = fusedk_tensor_cpu(a, FUSEDK_F32, 3, s3), ty = x;
  x.strides = far, ty.data = y;
  st = fusedk_act(&ty, &x, FUSEDK_ACT_GELU, NULL);
  EXPECT(st == FUSEDK_ERR_LAYOUT && strstr(fusedk_failure_reason(), "act: x has stride 1125899906842624 in dim 0 "
                                                                    "(size 1024): its strides reach past 2^59"),
         "huge strides: %s %s", fusedk_status_name(st), fusedk_failure_reason());
  int64_t q4[4] = {1, 2, 2, 4}, t2[2] = {2, 2};
  float q[16], k[16], v[16], qo[16], ko[16], c[4] = {1, 1, 1, 1}, sn[4] = {0};
  fusedk_tensor tq = fusedk_tensor_cpu(q, FUSEDK_F32, 4, q4), tk = tq, tv = tq, tqo = tq, tko = tq;
  tk.data = k, tv.data = v, tqo.data = qo, tko.data = ko;
  fusedk_tensor tc = fusedk_tensor_cpu(c, FUSEDK_F32, 2, t2), ts = fusedk_tensor_cpu(sn, FUSEDK_F32, 2, t2);
  st = fusedk_qk_norm_rope(&tqo, &tko, NULL, &tq, &tk, &tv, &tc, &ts, NULL, NULL, 1e-6f, FUSEDK_QK_NORM_HEAD,
                           FUSEDK_ROPE_INTERLEAVED, FUSEDK_LAYOUT_BSHD, 0, NULL);
  EXPECT(st == FUSEDK_ERR_INVALID_ARGUMENT && strstr(fusedk_failure_reason(), "v is given but v_out is NULL"),
         "qk_norm_rope v without v_out: %s %s", fusedk_status_name(st), fusedk_failure_reason());
  { /* k with no heads, NULL data and negative strides (empty): no address is formed from it */
    int64_t k0[4] = {1, 2, 0, 4}, kst[4] = {-15, -15, 0, 1};
    fusedk_tensor tk0 = fusedk_tensor_cpu(NULL, FUSEDK_F32, 4, k0), tko0 = tk0;
    tk0.strides = kst, tk0.byte_offset = 8, tko0.data = ko;
    st = fusedk_qk_norm_rope(&tqo, &tko0, NULL, &tq, &tk0, NULL, &tc, &ts, NULL, NULL, 1e-6f, FUSEDK_QK_NORM_FULL,
                             FUSEDK_ROPE_INTERLEAVED, FUSEDK_LAYOUT_BSHD, 0, NULL);
    EXPECT(st == FUSEDK_OK, "qk_norm_rope with a headless k: %s %s", fusedk_status_name(st), fusedk_failure_reason());
  }
  const fusedk_tensor *ts3[3] = {NULL, NULL, &tc};
  double attrs[5] = {10000.0, -INFINITY, 56, 56, 0};
  int64_t out[FUSEDK_MAX_DIMS];
  EXPECT(fusedk_op_out_shape(FUSEDK_OP_ROPE_TABLE_AXES, 0, ts3, attrs, out) < 0 &&
             strstr(fusedk_failure_reason(), "attribute axes_dim0 is -inf, expected an integer"),
         "out_shape with an infinite integer attribute: %s", fusedk_failure_reason());
  attrs[1] = 2.5;
  EXPECT(fusedk_op_out_shape(FUSEDK_OP_ROPE_TABLE_AXES, 0, ts3, attrs, out) < 0 &&
             strstr(fusedk_failure_reason(), "attribute axes_dim0 is 2.5, expected an integer"),
         "out_shape axes_dim 2.5: %s", fusedk_failure_reason());
  int64_t xk0[2] = {2, 0}, wk0[2] = {8, 0};
  fusedk_tensor lx = fusedk_tensor_cpu(NULL, FUSEDK_F32, 2, xk0), lw = fusedk_tensor_cpu(NULL, FUSEDK_F32, 2, wk0);
  fusedk_tensor lb = fusedk_tensor_cpu(c, FUSEDK_F32, 1, s2 + 1), lyt = fusedk_tensor_cpu(y, FUSEDK_F32, 2, s2);
  float bias8[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  lb.data = bias8;
  st = fusedk_linear(&lyt, NULL, &lx, &lw, &lb, FUSEDK_ACT_RELU, 0, NULL);
  EXPECT(st == FUSEDK_OK && y[0] == 1.0f && y[15] == 8.0f, "linear K = 0, no data: %s %s y %g %g",
         fusedk_status_name(st), fusedk_failure_reason(), (double)y[0], (double)y[15]);
}

/* attention: a bad value for every argument (status, reason naming it, out and lse untouched);
   what the reference gives where it is known exactly: q = 0 averages v over the keys a row sees
   (causal: the first i + 1 with Sq = Sk; kv_len: the first kv_len[b]); a row that sees none: 0,
   lse -inf; lse = log(keys seen) */
static void attention_cases(void) {
  enum { AB = 2, AS = 4, AH = 2, AD = 4, AN = AB * AS * AH * AD };
  static float q[AN], k[AN], v[AN], o[AN], lse[AB * AH * AS];
  int64_t qs[4] = {AB, AS, AH, AD}, ks1[4] = {AB, AS, 1, AD}, ls[3] = {AB, AH, AS}, bs[1] = {AB};
  int64_t bad_b[4] = {1, AS, AH, AD}, bad_h[4] = {AB, AS, 3, AD}, bad_l[3] = {AB, AS, AH};
  int32_t kvl[AB] = {3, 0}, kvl_neg[AB] = {-1, 2}, kvl_big[AB] = {2, AS + 1};
  float kvl_f[AB] = {3, 0};
  for (int i = 0; i < AN; ++i) q[i] = 0.0f, k[i] = (float)sin(i + 0.5), v[i] = (float)(i % 7) - 3.0f;
  fusedk_tensor tq = fusedk_tensor_cpu(q, FUSEDK_F32, 4, qs), tk = fusedk_tensor_cpu(k, FUSEDK_F32, 4, qs);
  fusedk_tensor tv = fusedk_tensor_cpu(v, FUSEDK_F32, 4, qs), to = fusedk_tensor_cpu(o, FUSEDK_F32, 4, qs);
  fusedk_tensor tl = fusedk_tensor_cpu(lse, FUSEDK_F32, 3, ls), tn = fusedk_tensor_cpu(kvl, FUSEDK_I32, 1, bs);
  fusedk_tensor tnf = fusedk_tensor_cpu(kvl_f, FUSEDK_F32, 1, bs), tk1 = fusedk_tensor_cpu(k, FUSEDK_F32, 4, ks1);
  fusedk_tensor tnn = fusedk_tensor_cpu(kvl_neg, FUSEDK_I32, 1, bs), tnb = fusedk_tensor_cpu(kvl_big, FUSEDK_I32, 1, bs);
  fusedk_tensor tkb = fusedk_tensor_cpu(k, FUSEDK_F32, 4, bad_b), tkh = fusedk_tensor_cpu(k, FUSEDK_F32, 4, bad_h);
  fusedk_tensor tlb = fusedk_tensor_cpu(lse, FUSEDK_F32, 3, bad_l), tv16 = tv, tq3 = tq;
  tv16.dtype = fusedk_dtype_of(FUSEDK_F16), tq3.ndim = 3;
  struct {
    const fusedk_tensor *out, *lse, *q, *k, *v, *kv_len;
    float scale;
    int causal;
    fusedk_status want;
    const char *says;
  } bad[] = {
      {NULL, &tl, &tq, &tk, &tv, NULL, 0, 0, FUSEDK_ERR_INVALID_ARGUMENT, "out is NULL"},
      {&to, &tl, NULL, &tk, &tv, NULL, 0, 0, FUSEDK_ERR_INVALID_ARGUMENT, "q is NULL"},
      {&to, &tl, &tq, NULL, &tv, NULL, 0, 0, FUSEDK_ERR_INVALID_ARGUMENT, "k is NULL"},
      {&to, &tl, &tq, &tk, NULL, NULL, 0, 0, FUSEDK_ERR_INVALID_ARGUMENT, "v is NULL"},
      {&to, &tl, &tq3, &tk, &tv, NULL, 0, 0, FUSEDK_ERR_SHAPE, "q has ndim 3, expected 4"},
      {&to, &tl, &tq, &tkb, &tv, NULL, 0, 0, FUSEDK_ERR_SHAPE, "k has shape [1, 4, 2, 4], expected [B, Sk, Hkv, Dh]"},
      {&to, &tl, &tq, &tkh, &tv, NULL, 0, 0, FUSEDK_ERR_SHAPE, "k has 3 heads, expected a divisor of q's 2"},
      {&to, &tl, &tq, &tk1, &tv, NULL, 0, 0, FUSEDK_ERR_SHAPE, "v has shape [2, 4, 2, 4], expected [2, 4, 1, 4]"},
      {&to, &tl, &tq, &tk, &tv16, NULL, 0, 0, FUSEDK_ERR_DTYPE, "v has dtype float16, expected float32"},
      {&to, &tlb, &tq, &tk, &tv, NULL, 0, 0, FUSEDK_ERR_SHAPE, "lse has shape [2, 4, 2], expected [2, 2, 4]"},
      {&to, &tl, &tq, &tk, &tv, &tnf, 0, 0, FUSEDK_ERR_DTYPE, "kv_len has dtype float32, expected int32"},
      {&to, &tl, &tq, &tk, &tv, &tnn, 0, 0, FUSEDK_ERR_INVALID_ARGUMENT, "kv_len[0] is -1, expected 0 to 4 (k's Sk)"},
      {&to, &tl, &tq, &tk, &tv, &tnb, 0, 0, FUSEDK_ERR_INVALID_ARGUMENT, "kv_len[1] is 5, expected 0 to 4 (k's Sk)"},
      {&to, &tl, &tq, &tk, &tv, NULL, NAN, 0, FUSEDK_ERR_INVALID_ARGUMENT, "scale is nan, expected a finite"},
      {&to, &tl, &tq, &tk, &tv, NULL, 0, 2, FUSEDK_ERR_INVALID_ARGUMENT, "causal is 2, expected 0 or 1"},
      {&tq, &tl, &tq, &tk, &tv, NULL, 0, 0, FUSEDK_ERR_LAYOUT, "out overlaps q"},
      {&tn, &tl, &tq, &tk, &tv, NULL, 0, 0, FUSEDK_ERR_DTYPE, "out has dtype int32, expected float32"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    for (int j = 0; j < AN; ++j) o[j] = SENTINEL;
    for (int j = 0; j < AB * AH * AS; ++j) lse[j] = SENTINEL;
    const fusedk_status st = fusedk_attention(bad[i].out, bad[i].lse, bad[i].q, bad[i].k, bad[i].v, bad[i].kv_len,
                                              bad[i].scale, bad[i].causal, NULL);
    int clean = 1;
    for (int j = 0; j < AN; ++j) clean = clean && (o[j] == SENTINEL || bad[i].out == &tq);
    for (int j = 0; j < AB * AH * AS; ++j) clean = clean && lse[j] == SENTINEL;
    EXPECT(st == bad[i].want && clean && strstr(fusedk_failure_reason(), "attention: ") &&
               strstr(fusedk_failure_reason(), bad[i].says),
           "attention case %zu: %s, want %s (%s), outputs untouched %d", i, fusedk_status_name(st),
           fusedk_status_name(bad[i].want), fusedk_failure_reason(), clean);
  }
  for (int i = 0; i < AN; ++i) q[i] = 0.0f;
  /* q = 0: every score 0, out = the mean of the v rows a row sees, lse = log(their count) */
  for (int causal = 0; causal < 2; ++causal)
    for (int with_len = 0; with_len < 2; ++with_len) {
      fusedk_status st = fusedk_attention(&to, &tl, &tq, &tk, &tv, with_len ? &tn : NULL, 0.5f, causal, NULL);
      int ok = st == FUSEDK_OK;
      for (int b = 0; b < AB; ++b)
        for (int i = 0; i < AS; ++i)
          for (int h = 0; h < AH; ++h) {
            int n = causal ? i + 1 : AS;
            if (with_len && kvl[b] < n) n = kvl[b];
            const float want_lse = n ? (float)log((double)n) : -INFINITY;
            ok = ok && lse[(b * AH + h) * AS + i] == want_lse;
            for (int d = 0; d < AD; ++d) {
              double m = 0.0;
              for (int j = 0; j < n; ++j) m += v[((b * AS + j) * AH + h) * AD + d];
              ok = ok && fabs(o[((b * AS + i) * AH + h) * AD + d] - (n ? m / n : 0.0)) <= 1e-6;
            }
          }
      EXPECT(ok, "attention q = 0, causal %d, kv_len %d: %s", causal, with_len, fusedk_status_name(st));
    }
}

/* qk_norm_rope_int8: its reference equals qk_norm_rope's float32 reference quantized here (a row's
   amax, rintf(x * (127 / amax)), scale amax / 127) bit for bit, for both styles, head and full
   norms, partial rotary and GQA, through strided outputs; a zero row gives 0 and scale 0, a NaN
   row 0 and scale NaN; bad arguments named, outputs untouched */
static void qk_int8_cases(void) {
  enum { QB = 2, QS = 3, QH = 4, QK = 2, QD = 12, NQ = QB * QS * QH * QD, NK = QB * QS * QK * QD };
  static float q[NQ], k[NK], qf[NQ], kf[NK], cs[QS * QD / 2], sn[QS * QD / 2], wq[QH * QD], wk[QK * QD];
  static float qs[QB * QS * QH * 2], ks[QB * QS * QK];
  static int8_t q8[NQ * 2], k8[NK];
  int64_t qsh[4] = {QB, QS, QH, QD}, ksh[4] = {QB, QS, QK, QD}, qss[3] = {QB, QS, QH}, kss[3] = {QB, QS, QK};
  /* q's outputs strided: its data's heads and its scales' tokens padded to twice their size */
  int64_t q8st[4] = {QS * QH * 2 * QD, QH * 2 * QD, 2 * QD, 1}, qsst[3] = {QS * QH * 2, QH * 2, 1};
  for (int i = 0; i < NQ; ++i) q[i] = (float)sin(0.7 * i + 0.2) * (float)(1 + i % 3);
  for (int i = 0; i < NK; ++i) k[i] = (float)cos(0.45 * i) * 2.0f + 0.5f;
  for (int i = 0; i < QH * QD; ++i) wq[i] = 0.5f + (float)(i % 7) / 8.0f;
  for (int i = 0; i < QK * QD; ++i) wk[i] = 1.25f - (float)(i % 5) / 8.0f;
  q[QD] = 0.0f; /* head 1 of token 0: all zeros (its weights cannot help: scale 0) */
  for (int d = 0; d < QD; ++d) q[QD + d] = 0.0f;
  q[3 * QD + 5] = NAN; /* head 3 of token 0: a NaN */
  fusedk_tensor tq = fusedk_tensor_cpu(q, FUSEDK_F32, 4, qsh), tk = fusedk_tensor_cpu(k, FUSEDK_F32, 4, ksh);
  fusedk_tensor tqf = fusedk_tensor_cpu(qf, FUSEDK_F32, 4, qsh), tkf = fusedk_tensor_cpu(kf, FUSEDK_F32, 4, ksh);
  fusedk_tensor tq8 = fusedk_tensor_cpu(q8, FUSEDK_I8, 4, qsh), tk8 = fusedk_tensor_cpu(k8, FUSEDK_I8, 4, ksh);
  fusedk_tensor tqs = fusedk_tensor_cpu(qs, FUSEDK_F32, 3, qss), tks = fusedk_tensor_cpu(ks, FUSEDK_F32, 3, kss);
  tq8.strides = q8st, tqs.strides = qsst;
  const fusedk_scaled_tensor sq = {&tq8, &tqs}, sk = {&tk8, &tks};
  int ok = 1;
  for (int style = 0; style < 2; ++style)
    for (int norm = 0; norm < 3; ++norm)
      for (int R = 12; R >= 8; R -= 4) {
        int64_t th[2] = {QS, R / 2}, wqs[1] = {norm == FUSEDK_QK_NORM_FULL ? QH * QD : QD},
                wks[1] = {norm == FUSEDK_QK_NORM_FULL ? QK * QD : QD};
        for (int i = 0; i < QS * R / 2; ++i) cs[i] = (float)cos(0.3 * i), sn[i] = (float)sin(0.3 * i);
        fusedk_tensor tc = fusedk_tensor_cpu(cs, FUSEDK_F32, 2, th), ts = fusedk_tensor_cpu(sn, FUSEDK_F32, 2, th);
        fusedk_tensor twq = fusedk_tensor_cpu(wq, FUSEDK_F32, 1, wqs), twk = fusedk_tensor_cpu(wk, FUSEDK_F32, 1, wks);
        const int w = norm != FUSEDK_QK_NORM_NONE;
        memset(q8, 0x80, sizeof q8), memset(qs, 0xff, sizeof qs);
        fusedk_status st = fusedk_qk_norm_rope(&tqf, &tkf, NULL, &tq, &tk, NULL, &tc, &ts, w ? &twq : NULL,
                                               w ? &twk : NULL, 1e-6f, (fusedk_qk_norm)norm, (fusedk_rope_style)style,
                                               FUSEDK_LAYOUT_BSHD, R, NULL);
        fusedk_status st8 = fusedk_qk_norm_rope_int8(&sq, &sk, &tq, &tk, &tc, &ts, w ? &twq : NULL, w ? &twk : NULL,
                                                     1e-6f, (fusedk_qk_norm)norm, (fusedk_rope_style)style, R, NULL);
        ok = ok && !st && !st8;
        for (int j = 0; ok && j < 2; ++j) {
          const int H = j ? QK : QH;
          const float *x = j ? kf : qf;
          for (int r = 0; r < QB * QS * H; ++r) {
            const int8_t *d8 = j ? k8 + r * QD : q8 + r * 2 * QD;
            const int rs = r / QH * 2 * QH + r % QH; /* q's scale of row r (tokens padded) */
            const float sc = j ? ks[r] : qs[rs];
            float amax = 0.0f;
            int nan = 0;
            for (int d = 0; d < QD; ++d) nan |= x[r * QD + d] != x[r * QD + d], amax = fmaxf(amax, fabsf(x[r * QD + d]));
            const float inv = amax > 0.0f && !nan ? 127.0f / amax : 0.0f;
            ok = ok && (nan ? sc != sc : sc == amax / 127.0f) && (j || qs[rs + QH] != qs[rs + QH]);
            for (int d = 0; d < QD; ++d) {
              const float v = rintf(x[r * QD + d] * inv);
              ok = ok && d8[d] == (int8_t)(v != v ? 0 : v) && (j || q8[r * 2 * QD + QD + d] == -128);
            }
          }
        }
        EXPECT(ok, "qk_norm_rope_int8 style %d norm %d R %d: %s %s", style, norm, R, fusedk_status_name(st8),
               fusedk_failure_reason());
      }
  EXPECT(qs[1] == 0.0f && q8[2 * QD] == 0 && qs[3] != qs[3] && q8[3 * 2 * QD] == 0,
         "qk_norm_rope_int8: a zero row 0 with scale 0, a NaN row 0 with scale NaN");
  /* bad arguments: named, nothing written */
  int64_t th[2] = {QS, QD / 2}, bad_s[3] = {QB, QS, QK + 1}, k5[4] = {QB, QS, QK, QD - 2};
  fusedk_tensor tc = fusedk_tensor_cpu(cs, FUSEDK_F32, 2, th), ts = fusedk_tensor_cpu(sn, FUSEDK_F32, 2, th);
  fusedk_tensor tks_bad = fusedk_tensor_cpu(ks, FUSEDK_F32, 3, bad_s), tk8_16 = tk8, tk_short = tk;
  tk8_16.dtype.code = FUSEDK_DTYPE_FLOAT, tk8_16.dtype.bits = 16, tk_short.shape = k5;
  const fusedk_scaled_tensor sk_bad = {&tk8, &tks_bad}, sk_f16 = {&tk8_16, &tks}, sk_none = {NULL, &tks};
  struct { const fusedk_scaled_tensor *q, *k; const fusedk_tensor *kin; int norm; fusedk_status want; const char *why; } bad[] = {
      {&sq, &sk_bad, &tk, 0, FUSEDK_ERR_SHAPE, "k_out_scale has shape [2, 3, 3], expected [2, 3, 2] ([B, S, H] of its input)"},
      {&sq, &sk_f16, &tk, 0, FUSEDK_ERR_DTYPE, "k_out has dtype float16, expected int8"},
      {&sq, &sk_none, &tk, 0, FUSEDK_ERR_INVALID_ARGUMENT, "k_out is NULL"},
      {NULL, &sk, &tk, 0, FUSEDK_ERR_INVALID_ARGUMENT, "q_out is NULL"},
      {&sq, &sk, &tk_short, 0, FUSEDK_ERR_SHAPE, "k_out has shape [2, 3, 2, 12], expected [2, 3, 2, 10]"},
      {&sq, &sk, &tk, 7, FUSEDK_ERR_INVALID_ARGUMENT, "norm is 7, expected"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    memset(q8, 0x80, sizeof q8), memset(k8, 0x80, sizeof k8), memset(qs, 0xff, sizeof qs), memset(ks, 0xff, sizeof ks);
    fusedk_status st = fusedk_qk_norm_rope_int8(bad[i].q, bad[i].k, &tq, bad[i].kin, &tc, &ts, NULL, NULL, 1e-6f,
                                                (fusedk_qk_norm)bad[i].norm, FUSEDK_ROPE_INTERLEAVED, 0, NULL);
    int clean = 1;
    for (int e = 0; e < NQ * 2; ++e) clean = clean && q8[e] == -128;
    for (int e = 0; e < NK; ++e) clean = clean && k8[e] == -128;
    EXPECT(st == bad[i].want && clean && strstr(fusedk_failure_reason(), "qk_norm_rope_int8: ") &&
               strstr(fusedk_failure_reason(), bad[i].why),
           "qk_norm_rope_int8 bad case %zu: %s (%s), outputs untouched %d", i, fusedk_status_name(st),
           fusedk_failure_reason(), clean);
  }
}

/* attention_int8_scaled: bad arguments named (the scaled tensors' parts among them), outputs
   untouched; the reference equals attention's reference on the dequantized q and k bit for bit
   (float32 copies of q8 * scale, exact at these scales: the same doubles go in), and cuts k's
   scale to 22 bits (a scale with a low bit set gives the cut scale's result) */
static void attention_scaled_cases(void) {
  enum { AB = 2, AS = 5, AK = 7, AH = 2, AD = 8, NQ = AB * AS * AH * AD, NK = AB * AK * 1 * AD };
  static int8_t q8[NQ], k8[NK];
  static float qs[AB * AS * AH], ks[AB * AK], ks_low[AB * AK], qf[NQ], kf[NK], v[NK], o[NQ], o2[NQ], lse[AB * AH * AS],
      lse2[AB * AH * AS];
  int64_t qsh[4] = {AB, AS, AH, AD}, ksh[4] = {AB, AK, 1, AD}, qss[3] = {AB, AS, AH}, kss[3] = {AB, AK, 1};
  int64_t ls[3] = {AB, AH, AS}, bad_s[3] = {AB, AS, 3}, bs[1] = {AB}, q0[4] = {AB, AS, AH, 0}, s0[4] = {0, 8, 8, 1};
  int64_t e0[4] = {AB, 0, AH, AD}, k0[4] = {AB, AK, 1, 0};
  int32_t kvl[AB] = {4, 0};
  for (int i = 0; i < NQ; ++i) q8[i] = (int8_t)((i * 37) % 255 - 127);
  for (int i = 0; i < NK; ++i) k8[i] = (int8_t)((i * 53 + 11) % 255 - 127), v[i] = (float)sin(0.3 * i);
  for (int i = 0; i < AB * AS * AH; ++i) qs[i] = (float)((i % 5) + 1) / 1024.0f;
  for (int i = 0; i < AB * AK; ++i) ks[i] = (float)((i % 3) + 2) / 512.0f, ks_low[i] = nextafterf(ks[i] + ks[i] / 4, 1.0f);
  for (int i = 0; i < NQ; ++i) qf[i] = (float)q8[i] * qs[i / AD];
  for (int i = 0; i < NK; ++i) kf[i] = (float)k8[i] * ks[i / AD];
  fusedk_tensor tq8 = fusedk_tensor_cpu(q8, FUSEDK_I8, 4, qsh), tk8 = fusedk_tensor_cpu(k8, FUSEDK_I8, 4, ksh);
  fusedk_tensor tqs = fusedk_tensor_cpu(qs, FUSEDK_F32, 3, qss), tks = fusedk_tensor_cpu(ks, FUSEDK_F32, 3, kss);
  fusedk_tensor tkl = fusedk_tensor_cpu(ks_low, FUSEDK_F32, 3, kss), tqf = fusedk_tensor_cpu(qf, FUSEDK_F32, 4, qsh);
  fusedk_tensor tkf = fusedk_tensor_cpu(kf, FUSEDK_F32, 4, ksh), tv = fusedk_tensor_cpu(v, FUSEDK_F32, 4, ksh);
  fusedk_tensor to = fusedk_tensor_cpu(o, FUSEDK_F32, 4, qsh), to2 = fusedk_tensor_cpu(o2, FUSEDK_F32, 4, qsh);
  fusedk_tensor tl = fusedk_tensor_cpu(lse, FUSEDK_F32, 3, ls), tl2 = fusedk_tensor_cpu(lse2, FUSEDK_F32, 3, ls);
  fusedk_tensor tn = fusedk_tensor_cpu(kvl, FUSEDK_I32, 1, bs), tqsb = fusedk_tensor_cpu(qs, FUSEDK_F32, 3, bad_s);
  fusedk_tensor tv8 = fusedk_tensor_cpu(k8, FUSEDK_I8, 4, ksh), tqsi = tqs, tq0 = fusedk_tensor_cpu(q8, FUSEDK_I8, 4, q0);
  fusedk_tensor tob = to, tqe = fusedk_tensor_cpu(q8, FUSEDK_I8, 4, e0), toe = fusedk_tensor_cpu(o, FUSEDK_F32, 4, e0);
  fusedk_tensor tk0 = fusedk_tensor_cpu(k8, FUSEDK_I8, 4, k0), tv0 = fusedk_tensor_cpu(v, FUSEDK_F32, 4, k0);
  tqsi.dtype = fusedk_dtype_of(FUSEDK_I32), tob.strides = s0;
  const fusedk_scaled_tensor sq = {&tq8, &tqs}, sk = {&tk8, &tks}, sk_low = {&tk8, &tkl};
  const fusedk_scaled_tensor sq_f = {&tqf, &tqs}, sq_i = {&tq8, &tqsi}, sq_b = {&tq8, &tqsb}, sq_n = {NULL, &tqs};
  const fusedk_scaled_tensor sq_0 = {&tq0, &tqs}, sk_0 = {&tk0, &tks};
  struct {
    const fusedk_scaled_tensor *q, *k;
    const fusedk_tensor *v, *out;
    fusedk_status want;
    const char *says;
  } bad[] = {
      {NULL, &sk, &tv, &to, FUSEDK_ERR_INVALID_ARGUMENT, "q is NULL, expected a scaled tensor"},
      {&sq_n, &sk, &tv, &to, FUSEDK_ERR_INVALID_ARGUMENT, "q is NULL, expected a tensor"},
      {&sq_f, &sk, &tv, &to, FUSEDK_ERR_DTYPE, "q has dtype float32, expected int8"},
      {&sq_i, &sk, &tv, &to, FUSEDK_ERR_DTYPE, "q_scale has dtype int32, expected float32"},
      {&sq_b, &sk, &tv, &to, FUSEDK_ERR_SHAPE, "q_scale has shape [2, 5, 3], expected [2, 5, 2]"},
      {&sq, &sk, &tv8, &to, FUSEDK_ERR_DTYPE, "v has dtype int8, expected float32, float16 or bfloat16"},
      {&sq, &sq, &tv, &to, FUSEDK_ERR_SHAPE, "v has shape [2, 7, 1, 8], expected [2, 5, 2, 8]"},
      {&sq_0, &sk_0, &tv0, &to, FUSEDK_ERR_SHAPE, "v has last dim 0, expected >= 1"},
      {&sq, &sk, &tv, &tob, FUSEDK_ERR_LAYOUT, "output out has stride 0 in dim 0"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    for (int j = 0; j < NQ; ++j) o[j] = SENTINEL;
    const fusedk_status st =
        fusedk_attention_int8_scaled(bad[i].out, &tl, bad[i].q, bad[i].k, bad[i].v, NULL, 0.0f, 0, NULL);
    int clean = 1;
    for (int j = 0; j < NQ; ++j) clean = clean && o[j] == SENTINEL;
    EXPECT(st == bad[i].want && clean && strstr(fusedk_failure_reason(), "attention_int8_scaled: ") &&
               strstr(fusedk_failure_reason(), bad[i].says),
           "attention_int8_scaled case %zu: %s, want %s (%s), outputs untouched %d", i, fusedk_status_name(st),
           fusedk_status_name(bad[i].want), fusedk_failure_reason(), clean);
  }
  for (int causal = 0; causal < 2; ++causal)
    for (int with_len = 0; with_len < 2; ++with_len)
      for (int low = 0; low < 2; ++low) {
        const fusedk_tensor *n = with_len ? &tn : NULL;
        fusedk_status st = fusedk_attention_int8_scaled(&to, &tl, &sq, low ? &sk_low : &sk, &tv, n, -0.7f, causal, NULL);
        if (low) { /* the same scores as k's scales cut to 22 bits: ks_low's cut, by hand */
          for (int i = 0; i < NK; ++i) {
            uint32_t u;
            float c = ks_low[i / AD];
            memcpy(&u, &c, 4), u &= ~3u, memcpy(&c, &u, 4);
            kf[i] = (float)k8[i] * c;
          }
        }
        fusedk_status st2 = fusedk_attention(&to2, &tl2, &tqf, &tkf, &tv, n, -0.7f, causal, NULL);
        double worst = 0.0;
        for (int i = 0; i < NQ; ++i) worst = fmax(worst, fabs((double)o[i] - o2[i]));
        for (int i = 0; i < AB * AH * AS; ++i)
          worst = fmax(worst, lse[i] == lse2[i] ? 0.0 : fabs((double)lse[i] - lse2[i]));
        EXPECT(st == FUSEDK_OK && st2 == FUSEDK_OK && worst == 0.0,
               "attention_int8_scaled causal %d kv_len %d low bits %d: %s, max |diff| %g against attention on dq",
               causal, with_len, low, fusedk_status_name(st), worst);
        for (int i = 0; i < NK; ++i) kf[i] = (float)k8[i] * ks[i / AD];
      }
  /* negative scales count as their magnitudes: the same output bit for bit; no query: nothing */
  fusedk_status st = fusedk_attention_int8_scaled(&to2, &tl2, &sq, &sk, &tv, NULL, 0.0f, 0, NULL);
  for (int i = 0; i < AB * AS * AH; ++i) qs[i] = -qs[i];
  for (int i = 0; i < AB * AK; ++i) ks[i] = -ks[i];
  fusedk_status st2 = fusedk_attention_int8_scaled(&to, &tl, &sq, &sk, &tv, NULL, 0.0f, 0, NULL);
  int same = st == FUSEDK_OK && st2 == FUSEDK_OK;
  for (int i = 0; i < NQ; ++i) same = same && o[i] == o2[i];
  for (int i = 0; i < AB * AH * AS; ++i) same = same && lse[i] == lse2[i];
  EXPECT(same, "attention_int8_scaled with negative scales: %s %s, equal %d", fusedk_status_name(st),
         fusedk_status_name(st2), same);
  int64_t es[3] = {AB, 0, AH};
  fusedk_tensor tqse = fusedk_tensor_cpu(qs, FUSEDK_F32, 3, es), tle = fusedk_tensor_cpu(lse, FUSEDK_F32, 3, ls);
  const fusedk_scaled_tensor sq_e2 = {&tqe, &tqse};
  int64_t le[3] = {AB, AH, 0};
  tle.shape = le;
  st = fusedk_attention_int8_scaled(&toe, &tle, &sq_e2, &sk, &tv, NULL, 0.0f, 0, NULL);
  EXPECT(st == FUSEDK_OK, "attention_int8_scaled with no query: %s %s", fusedk_status_name(st), fusedk_failure_reason());
}

/* lowrank_update: a bad value for every argument (status, reason naming it, out untouched); the
   reference on small integers, where every product and sum is exact: the update alone, with
   codes and y, in place, and beta 0 over a NaN y */
static void lowrank_cases(void) {
  enum { LM = 3, LK = 4, LR = 2, LN = 5 };
  static float x[LM * LK], v[LK * LR], c[LM * LR], u[LR * LN], y[LM * LN], o[LM * LN], nany[LM * LN];
  int64_t xs[2] = {LM, LK}, vs[2] = {LK, LR}, cs[2] = {LM, LR}, us[2] = {LR, LN}, ys[2] = {LM, LN};
  int64_t v_bad[2] = {LK + 1, LR}, v_r0[2] = {LK, 0}, u_bad[2] = {LR + 1, LN}, c_bad[2] = {LM, LR + 1};
  for (int i = 0; i < LM * LK; ++i) x[i] = (float)(i % 5) - 2.0f;
  for (int i = 0; i < LK * LR; ++i) v[i] = (float)(i % 3) - 1.0f;
  for (int i = 0; i < LM * LR; ++i) c[i] = (float)(i % 4);
  for (int i = 0; i < LR * LN; ++i) u[i] = (float)(i % 7) - 3.0f;
  for (int i = 0; i < LM * LN; ++i) y[i] = (float)i, nany[i] = NAN;
  fusedk_tensor tx = fusedk_tensor_cpu(x, FUSEDK_F32, 2, xs), tv = fusedk_tensor_cpu(v, FUSEDK_F32, 2, vs);
  fusedk_tensor tc = fusedk_tensor_cpu(c, FUSEDK_F32, 2, cs), tu = fusedk_tensor_cpu(u, FUSEDK_F32, 2, us);
  fusedk_tensor ty = fusedk_tensor_cpu(y, FUSEDK_F32, 2, ys), to = fusedk_tensor_cpu(o, FUSEDK_F32, 2, ys);
  fusedk_tensor tvb = fusedk_tensor_cpu(v, FUSEDK_F32, 2, v_bad), tv0 = fusedk_tensor_cpu(v, FUSEDK_F32, 2, v_r0);
  fusedk_tensor tub = fusedk_tensor_cpu(u, FUSEDK_F32, 2, u_bad), tcb = fusedk_tensor_cpu(c, FUSEDK_F32, 2, c_bad);
  static float ybig[LM * LN + 1];
  fusedk_tensor tn = fusedk_tensor_cpu(nany, FUSEDK_F32, 2, ys), tc16 = tc, tya = fusedk_tensor_cpu(ybig, FUSEDK_F32, 2, ys);
  fusedk_tensor tyb = tya;
  tc16.dtype = fusedk_dtype_of(FUSEDK_F16);
  tyb.byte_offset = 4; /* one element on: overlaps tya, not the same view */
  struct {
    const fusedk_tensor *out, *x, *v, *codes, *u_t, *y;
    float scaling, beta;
    fusedk_status want;
    const char *says;
  } bad[] = {
      {NULL, &tx, &tv, NULL, &tu, NULL, 1, 1, FUSEDK_ERR_INVALID_ARGUMENT, "out is NULL"},
      {&to, NULL, &tv, NULL, &tu, NULL, 1, 1, FUSEDK_ERR_INVALID_ARGUMENT, "x is NULL"},
      {&to, &tx, NULL, NULL, &tu, NULL, 1, 1, FUSEDK_ERR_INVALID_ARGUMENT, "v is NULL"},
      {&to, &tx, &tv, NULL, NULL, NULL, 1, 1, FUSEDK_ERR_INVALID_ARGUMENT, "u_t is NULL"},
      {&to, &tx, &tvb, NULL, &tu, NULL, 1, 1, FUSEDK_ERR_SHAPE, "v has shape [5, 2], expected [K1, r] with K1 = 4"},
      {&to, &tx, &tv0, NULL, &tu, NULL, 1, 1, FUSEDK_ERR_SHAPE, "a rank r of 1..128"},
      {&to, &tx, &tv, NULL, &tub, NULL, 1, 1, FUSEDK_ERR_SHAPE, "u_t has shape [3, 5], expected [r, K2] with r = 2"},
      {&to, &tx, &tv, &tcb, &tu, NULL, 1, 1, FUSEDK_ERR_SHAPE, "codes has shape [3, 3], expected [3, 2]"},
      {&to, &tx, &tv, &tc16, &tu, NULL, 1, 1, FUSEDK_ERR_DTYPE, "codes has dtype float16, expected float32"},
      {&to, &tx, &tv, NULL, &tu, &tx, 1, 1, FUSEDK_ERR_SHAPE, "y has shape [3, 4], expected [3, 5]"},
      {&to, &tx, &tv, NULL, &tu, NULL, INFINITY, 1, FUSEDK_ERR_INVALID_ARGUMENT, "scaling is inf"},
      {&to, &tx, &tv, NULL, &tu, &ty, 1, NAN, FUSEDK_ERR_INVALID_ARGUMENT, "beta is nan"},
      {&tyb, &tx, &tv, NULL, &tu, &tya, 1, 1, FUSEDK_ERR_LAYOUT, "out overlaps y in memory"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    for (int j = 0; j < LM * LN; ++j) o[j] = SENTINEL, y[j] = (float)j;
    const fusedk_status st = fusedk_lowrank_update(bad[i].out, bad[i].x, bad[i].v, bad[i].codes, bad[i].u_t, bad[i].y,
                                                   bad[i].scaling, bad[i].beta, NULL);
    int clean = 1;
    for (int j = 0; j < LM * LN; ++j) clean = clean && o[j] == SENTINEL && y[j] == (float)j;
    EXPECT(st == bad[i].want && clean && strstr(fusedk_failure_reason(), "lowrank_update: ") &&
               strstr(fusedk_failure_reason(), bad[i].says),
           "lowrank_update case %zu: %s, want %s (%s), outputs untouched %d", i, fusedk_status_name(st),
           fusedk_status_name(bad[i].want), fusedk_failure_reason(), clean);
  }
  /* exact values: out = beta y + s sum_j (sum_k x v) codes u_t */
  for (int mode = 0; mode < 4; ++mode) { /* plain; codes and y; in place; beta 0 over NaN y */
    for (int j = 0; j < LM * LN; ++j) o[j] = SENTINEL, y[j] = (float)j;
    const float sc = 2.0f, beta = mode == 3 ? 0.0f : -1.0f;
    const fusedk_tensor *out = mode == 2 ? &ty : &to, *yy = mode == 0 ? NULL : mode == 3 ? &tn : &ty;
    const fusedk_status st = fusedk_lowrank_update(out, &tx, &tv, mode ? &tc : NULL, &tu, yy, sc, beta, NULL);
    int ok = st == FUSEDK_OK;
    for (int m = 0; m < LM; ++m)
      for (int n = 0; n < LN; ++n) {
        double want = mode == 1 || mode == 2 ? beta * (double)(m * LN + n) : 0.0;
        for (int r = 0; r < LR; ++r) {
          double h = 0.0;
          for (int k = 0; k < LK; ++k) h += (double)x[m * LK + k] * v[k * LR + r];
          want += sc * h * (mode ? c[m * LR + r] : 1.0) * u[r * LN + n];
        }
        ok = ok && (mode == 2 ? y : o)[m * LN + n] == (float)want;
      }
    EXPECT(ok, "lowrank_update exact values, mode %d: %s", mode, fusedk_status_name(st));
  }
}

/* lowrank_prepare and linear_lowrank: a bad value for every argument (status, reason naming it,
   outputs untouched); the references on small integers (every product and sum exact): w_cat's
   columns, and y = act(x w^T + bias + ((x a^T) * codes) (s b)^T) */
static void linear_lowrank_cases(void) {
  enum { QM = 3, QK = 4, QR = 3, QRP = 8, QN = 5 };
  static float x[QM * QK], w[QN * QK], a[QR * QK], b[QN * QR], c[QM * QR], bias[QN], wc[QN * (QK + QRP)], y[QM * QN];
  int64_t xs[2] = {QM, QK}, ws[2] = {QN, QK}, as[2] = {QR, QK}, bs[2] = {QN, QR}, cs[2] = {QM, QR}, ns[1] = {QN};
  int64_t wcs[2] = {QN, QK + QRP}, ys[2] = {QM, QN}, wc_bad[2] = {QN, QK + QR}, b_bad[2] = {QN + 1, QR}, b_r0[2] = {QN, 0};
  int64_t a_bad[2] = {QR, QK + 1}, a_big[2] = {129, QK}, c_bad[2] = {QM, QR + 1}, y_bad[2] = {QM, QN + 1};
  for (int i = 0; i < QM * QK; ++i) x[i] = (float)(i % 5) - 2.0f;
  for (int i = 0; i < QN * QK; ++i) w[i] = (float)(i % 3) - 1.0f;
  for (int i = 0; i < QR * QK; ++i) a[i] = (float)(i % 4) - 1.0f;
  for (int i = 0; i < QN * QR; ++i) b[i] = (float)(i % 7) - 3.0f;
  for (int i = 0; i < QM * QR; ++i) c[i] = (float)(i % 3);
  for (int i = 0; i < QN; ++i) bias[i] = (float)i - 2.0f;
  fusedk_tensor tx = fusedk_tensor_cpu(x, FUSEDK_F32, 2, xs), tw = fusedk_tensor_cpu(w, FUSEDK_F32, 2, ws);
  fusedk_tensor ta = fusedk_tensor_cpu(a, FUSEDK_F32, 2, as), tb = fusedk_tensor_cpu(b, FUSEDK_F32, 2, bs);
  fusedk_tensor tc = fusedk_tensor_cpu(c, FUSEDK_F32, 2, cs), tn = fusedk_tensor_cpu(bias, FUSEDK_F32, 1, ns);
  fusedk_tensor twc = fusedk_tensor_cpu(wc, FUSEDK_F32, 2, wcs), ty = fusedk_tensor_cpu(y, FUSEDK_F32, 2, ys);
  fusedk_tensor twcb = fusedk_tensor_cpu(wc, FUSEDK_F32, 2, wc_bad), tbb = fusedk_tensor_cpu(b, FUSEDK_F32, 2, b_bad);
  fusedk_tensor tb0 = fusedk_tensor_cpu(b, FUSEDK_F32, 2, b_r0), tab = fusedk_tensor_cpu(a, FUSEDK_F32, 2, a_bad);
  fusedk_tensor ta9 = fusedk_tensor_cpu(a, FUSEDK_F32, 2, a_big), tcb = fusedk_tensor_cpu(c, FUSEDK_F32, 2, c_bad);
  fusedk_tensor tyb = fusedk_tensor_cpu(y, FUSEDK_F32, 2, y_bad), tw16 = tw, twy = ty;
  tw16.dtype = fusedk_dtype_of(FUSEDK_F16);
  twy.shape = ws; /* y's memory as a [N, QK] w: overlaps y */
  struct {
    const fusedk_tensor *wc, *w, *b;
    float scaling;
    fusedk_status want;
    const char *says;
  } prep[] = {
      {NULL, &tw, &tb, 1, FUSEDK_ERR_INVALID_ARGUMENT, "w_cat is NULL"},
      {&twc, &tw, NULL, 1, FUSEDK_ERR_INVALID_ARGUMENT, "b is NULL"},
      {&twc, &tw, &tbb, 1, FUSEDK_ERR_SHAPE, "b has shape [6, 3], expected [N, r] with N (w's rows) = 5"},
      {&twc, &tw, &tb0, 1, FUSEDK_ERR_SHAPE, "a rank r of 1..128"},
      {&twcb, &tw, &tb, 1, FUSEDK_ERR_SHAPE, "w_cat has shape [5, 7], expected [5, 12]"},
      {&twc, &tw16, &tb, 1, FUSEDK_ERR_DTYPE, "b has dtype float32, expected float16 (the dtype of w)"},
      {&twc, &tw, &tb, NAN, FUSEDK_ERR_INVALID_ARGUMENT, "scaling is nan"},
  };
  for (size_t i = 0; i < sizeof prep / sizeof prep[0]; ++i) {
    for (int j = 0; j < QN * (QK + QRP); ++j) wc[j] = SENTINEL;
    const fusedk_status st = fusedk_lowrank_prepare(prep[i].wc, prep[i].w, prep[i].b, prep[i].scaling, NULL);
    int clean = 1;
    for (int j = 0; j < QN * (QK + QRP); ++j) clean = clean && wc[j] == SENTINEL;
    EXPECT(st == prep[i].want && clean && strstr(fusedk_failure_reason(), "lowrank_prepare: ") &&
               strstr(fusedk_failure_reason(), prep[i].says),
           "lowrank_prepare case %zu: %s, want %s (%s), w_cat untouched %d", i, fusedk_status_name(st),
           fusedk_status_name(prep[i].want), fusedk_failure_reason(), clean);
  }
  EXPECT(fusedk_lowrank_prepare(&twc, &tw, &tb, 2.0f, NULL) == FUSEDK_OK, "lowrank_prepare: %s", fusedk_failure_reason());
  int ok = 1;
  for (int n = 0; n < QN; ++n)
    for (int k = 0; k < QK + QRP; ++k)
      ok = ok && wc[n * (QK + QRP) + k] == (k < QK ? w[n * QK + k] : k < QK + QR ? 2.0f * b[n * QR + k - QK] : 0.0f);
  EXPECT(ok, "lowrank_prepare values: [w | 2 b | 0]");
  static int32_t ids[QM] = {1, -1, 0}, ids8[8];
  static float a2[2 * QR * QK], b2[2 * QN * QR], wc2[QN * (QK + 2 * QRP)], big[9 * 16 * QK];
  int64_t is[1] = {QM}, is_bad[1] = {QM + 1}, a2s[3] = {2, QR, QK}, b2s[3] = {2, QN, QR}, wc2s[2] = {QN, QK + 2 * QRP};
  int64_t bigs[3] = {9, 16, QK}, i8s[1] = {QM}, i8st[1] = {2};
  fusedk_tensor tid = fusedk_tensor_cpu(ids, FUSEDK_I32, 1, is), tidb = fusedk_tensor_cpu(ids8, FUSEDK_I32, 1, is_bad);
  fusedk_tensor tidf = fusedk_tensor_cpu(c, FUSEDK_F32, 1, is), tids = fusedk_tensor_cpu(ids8, FUSEDK_I32, 1, i8s);
  fusedk_tensor ta2 = fusedk_tensor_cpu(a2, FUSEDK_F32, 3, a2s), tb2 = fusedk_tensor_cpu(b2, FUSEDK_F32, 3, b2s);
  fusedk_tensor twc2 = fusedk_tensor_cpu(wc2, FUSEDK_F32, 2, wc2s), tbig = fusedk_tensor_cpu(big, FUSEDK_F32, 3, bigs);
  tids.strides = i8st;
  for (int i = 0; i < 2 * QR * QK; ++i) a2[i] = (float)(i % 5) - 2.0f;
  for (int i = 0; i < 2 * QN * QR; ++i) b2[i] = (float)(i % 3) - 1.0f;
  struct {
    const fusedk_tensor *y, *x, *wc, *bias, *a, *codes;
    int act;
    fusedk_status want;
    const char *says;
    const fusedk_tensor *ids;
  } bad[] = {
      {NULL, &tx, &twc, NULL, &ta, NULL, FUSEDK_ACT_NONE, FUSEDK_ERR_INVALID_ARGUMENT, "y is NULL", NULL},
      {&ty, &tx, NULL, NULL, &ta, NULL, FUSEDK_ACT_NONE, FUSEDK_ERR_INVALID_ARGUMENT, "w_cat is NULL", NULL},
      {&ty, &tx, &twc, NULL, NULL, NULL, FUSEDK_ACT_NONE, FUSEDK_ERR_INVALID_ARGUMENT, "a is NULL", NULL},
      {&ty, &tx, &twc, NULL, &tab, NULL, FUSEDK_ACT_NONE, FUSEDK_ERR_SHAPE, "a has shape [3, 5], expected [r, K] with K", NULL},
      {&ty, &tx, &twc, NULL, &ta9, NULL, FUSEDK_ACT_NONE, FUSEDK_ERR_SHAPE, "a rank r of 1..128", NULL},
      {&ty, &tx, &twcb, NULL, &ta, NULL, FUSEDK_ACT_NONE, FUSEDK_ERR_SHAPE, "w_cat has shape [5, 7], expected [N, 12]", NULL},
      {&ty, &tx, &twc, &tx, &ta, NULL, FUSEDK_ACT_NONE, FUSEDK_ERR_SHAPE, "bias has shape [3, 4], expected [5]", NULL},
      {&ty, &tx, &twc, NULL, &ta, &tcb, FUSEDK_ACT_NONE, FUSEDK_ERR_SHAPE, "codes has shape [3, 4], expected [3, 3]", NULL},
      {&tyb, &tx, &twc, NULL, &ta, NULL, FUSEDK_ACT_NONE, FUSEDK_ERR_SHAPE, "y has shape [3, 6], expected [3, 5]", NULL},
      {&ty, &tx, &twc, NULL, &ta, NULL, 7, FUSEDK_ERR_INVALID_ARGUMENT, "act is 7", NULL},
      {&ty, &tx, &twc, NULL, &twy, NULL, FUSEDK_ACT_NONE, FUSEDK_ERR_LAYOUT, "output y overlaps a in memory", NULL},
      {&ty, &tx, &twc, NULL, &ta, NULL, FUSEDK_ACT_NONE, FUSEDK_ERR_SHAPE, "adapter_ids has shape [4], expected [3]", &tidb},
      {&ty, &tx, &twc, NULL, &ta, NULL, FUSEDK_ACT_NONE, FUSEDK_ERR_DTYPE, "adapter_ids has dtype float32, expected int32",
       &tidf},
      {&ty, &tx, &twc, NULL, &ta, NULL, FUSEDK_ACT_NONE, FUSEDK_ERR_LAYOUT, "adapter_ids has stride 2", &tids},
      {&ty, &tx, &twc, NULL, &tbig, NULL, FUSEDK_ACT_NONE, FUSEDK_ERR_SHAPE, "9 adapters of rank 16 make 144 columns", NULL},
      {&ty, &tx, &twc, NULL, &ta2, NULL, FUSEDK_ACT_NONE, FUSEDK_ERR_SHAPE, "w_cat has shape [5, 12], expected [N, 20]", NULL},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    for (int j = 0; j < QM * QN; ++j) y[j] = SENTINEL;
    const fusedk_status st = fusedk_linear_lowrank(bad[i].y, NULL, bad[i].x, bad[i].wc, bad[i].bias, bad[i].a, bad[i].codes,
                                                   bad[i].ids, (fusedk_activation)bad[i].act, NULL);
    int clean = 1;
    for (int j = 0; j < QM * QN; ++j) clean = clean && y[j] == SENTINEL;
    EXPECT(st == bad[i].want && clean && strstr(fusedk_failure_reason(), "linear_lowrank: ") &&
               strstr(fusedk_failure_reason(), bad[i].says),
           "linear_lowrank case %zu: %s, want %s (%s), y untouched %d", i, fusedk_status_name(st),
           fusedk_status_name(bad[i].want), fusedk_failure_reason(), clean);
  }
  static float aux[QM * QN];
  fusedk_tensor taux = fusedk_tensor_cpu(aux, FUSEDK_F32, 2, ys);
  for (int mode = 0; mode < 2; ++mode) { /* no codes, no bias; codes, bias, relu and aux_out */
    const fusedk_status st = fusedk_linear_lowrank(&ty, mode ? &taux : NULL, &tx, &twc, mode ? &tn : NULL, &ta,
                                                   mode ? &tc : NULL, NULL, mode ? FUSEDK_ACT_RELU : FUSEDK_ACT_NONE, NULL);
    ok = st == FUSEDK_OK;
    for (int m = 0; m < QM; ++m)
      for (int n = 0; n < QN; ++n) {
        double want = mode ? bias[n] : 0.0;
        for (int k = 0; k < QK; ++k) want += (double)x[m * QK + k] * w[n * QK + k];
        for (int j = 0; j < QR; ++j) {
          double h = 0.0;
          for (int k = 0; k < QK; ++k) h += (double)x[m * QK + k] * a[j * QK + k];
          want += h * (mode ? c[m * QR + j] : 1.0) * 2.0 * b[n * QR + j];
        }
        ok = ok && y[m * QN + n] == (float)(mode && want < 0 ? 0.0 : want) && (!mode || aux[m * QN + n] == (float)want);
      }
    EXPECT(ok, "linear_lowrank exact values, mode %d: %s", mode, fusedk_status_name(st));
  }
  { /* x with room for h ([QM, QK + QRP], compact): the same y, x's columns kept, h = (x a^T) * codes
       written after them (zeros past r); x overlapping codes refused, nothing written */
    static float xr[QM * (QK + QRP)], yr[QM * QN];
    int64_t xrs[2] = {QM, QK + QRP};
    for (int i = 0; i < QM * (QK + QRP); ++i) {
      const int m = i / (QK + QRP), k = i % (QK + QRP);
      xr[i] = k < QK ? x[m * QK + k] : 99.0f;
    }
    fusedk_tensor txr = fusedk_tensor_cpu(xr, FUSEDK_F32, 2, xrs), tyr = fusedk_tensor_cpu(yr, FUSEDK_F32, 2, ys);
    fusedk_status st = fusedk_linear_lowrank(&tyr, NULL, &txr, &twc, &tn, &ta, &tc, NULL, FUSEDK_ACT_RELU, NULL);
    ok = st == FUSEDK_OK && memcmp(yr, y, sizeof y) == 0; /* y: mode 1's above */
    for (int m = 0; m < QM; ++m)
      for (int j = 0; j < QK + QRP; ++j) {
        double h = 0.0;
        for (int k = 0; k < QK && j >= QK && j - QK < QR; ++k) h += (double)x[m * QK + k] * a[(j - QK) * QK + k];
        const double want = j < QK ? x[m * QK + j] : h * (j - QK < QR ? c[m * QR + j - QK] : 0.0);
        ok = ok && xr[m * (QK + QRP) + j] == (float)want;
      }
    EXPECT(ok, "linear_lowrank exact values, x with room for h: %s", fusedk_status_name(st));
    fusedk_tensor tcx = tc;
    tcx.data = xr + QK; /* codes inside x's rows */
    for (int i = 0; i < QM * QN; ++i) yr[i] = -7.0f;
    st = fusedk_linear_lowrank(&tyr, NULL, &txr, &twc, NULL, &ta, &tcx, NULL, FUSEDK_ACT_NONE, NULL);
    EXPECT(st == FUSEDK_ERR_LAYOUT && strstr(fusedk_failure_reason(), "x (with room for h)") && yr[0] == -7.0f,
           "linear_lowrank, codes inside x with room: %s (%s)", fusedk_status_name(st), fusedk_failure_reason());
    /* rows closer than K + A rp (h would land on the next row's x): refused; one row of x [K + A rp] */
    int64_t close_strides[2] = {QK + 1, 1};
    fusedk_tensor txc = txr;
    txc.strides = close_strides;
    st = fusedk_linear_lowrank(&tyr, NULL, &txc, &twc, NULL, &ta, NULL, NULL, FUSEDK_ACT_NONE, NULL);
    EXPECT(st == FUSEDK_ERR_LAYOUT && strstr(fusedk_failure_reason(), "x has a row stride") && yr[0] == -7.0f,
           "linear_lowrank, x with room on overlapping rows: %s (%s)", fusedk_status_name(st), fusedk_failure_reason());
    int64_t one[1] = {QK + QRP}, y1s[1] = {QN};
    fusedk_tensor tx1 = fusedk_tensor_cpu(xr, FUSEDK_F32, 1, one), ty1 = fusedk_tensor_cpu(yr, FUSEDK_F32, 1, y1s);
    st = fusedk_linear_lowrank(&ty1, NULL, &tx1, &twc, &tn, &ta, NULL, NULL, FUSEDK_ACT_NONE, NULL);
    EXPECT(st == FUSEDK_OK && yr[1] != -7.0f, "linear_lowrank, one row of x with room: %s (%s)", fusedk_status_name(st),
           fusedk_failure_reason());
  }
  /* two stacked adapters, scaling 2: w_cat's slots, then rows by ids {1, -1, 0} and, without ids,
     both adapters on every row */
  EXPECT(fusedk_lowrank_prepare(&twc2, &tw, &tb2, 2.0f, NULL) == FUSEDK_OK, "lowrank_prepare, 2 adapters: %s",
         fusedk_failure_reason());
  ok = 1;
  for (int n = 0; n < QN; ++n)
    for (int k = 0; k < QK + 2 * QRP; ++k) {
      const int q = (k - QK) / QRP, j = (k - QK) % QRP;
      ok = ok && wc2[n * (QK + 2 * QRP) + k] == (k < QK ? w[n * QK + k] : j < QR ? 2.0f * b2[(q * QN + n) * QR + j] : 0.0f);
    }
  EXPECT(ok, "lowrank_prepare values, 2 adapters: [w | 2 b_0 | 0 | 2 b_1 | 0]");
  for (int with_ids = 0; with_ids < 2; ++with_ids) {
    const fusedk_status st = fusedk_linear_lowrank(&ty, NULL, &tx, &twc2, NULL, &ta2, &tc, with_ids ? &tid : NULL,
                                                   FUSEDK_ACT_NONE, NULL);
    ok = st == FUSEDK_OK;
    for (int m = 0; m < QM; ++m)
      for (int n = 0; n < QN; ++n) {
        double want = 0.0;
        for (int k = 0; k < QK; ++k) want += (double)x[m * QK + k] * w[n * QK + k];
        for (int q = 0; q < 2; ++q)
          for (int j = 0; j < QR && (!with_ids || ids[m] == q); ++j) {
            double h = 0.0;
            for (int k = 0; k < QK; ++k) h += (double)x[m * QK + k] * a2[(q * QR + j) * QK + k];
            want += h * c[m * QR + j] * 2.0 * b2[(q * QN + n) * QR + j];
          }
        ok = ok && y[m * QN + n] == (float)want;
      }
    EXPECT(ok, "linear_lowrank exact values, 2 adapters, ids %d: %s", with_ids, fusedk_status_name(st));
  }
  /* linear_lowrank_backward of those two adapters (scaling 2), rows by ids, and relu through aux */
  static float dy[QM * QN], dx[QM * QK], da[2 * QR * QK], db[2 * QN * QR], dc[QM * QR], dbias[QN];
  fusedk_tensor tdy = fusedk_tensor_cpu(dy, FUSEDK_F32, 2, ys), tdx = fusedk_tensor_cpu(dx, FUSEDK_F32, 2, xs);
  fusedk_tensor tda = fusedk_tensor_cpu(da, FUSEDK_F32, 3, a2s), tdb = fusedk_tensor_cpu(db, FUSEDK_F32, 3, b2s);
  fusedk_tensor tdc = fusedk_tensor_cpu(dc, FUSEDK_F32, 2, cs), tdn = fusedk_tensor_cpu(dbias, FUSEDK_F32, 1, ns);
  fusedk_tensor tdbb = fusedk_tensor_cpu(db, FUSEDK_F32, 2, bs);
  for (int i = 0; i < QM * QN; ++i) dy[i] = (float)(i % 5) - 2.0f, aux[i] = (float)(i % 3) - 1.0f;
  for (int relu = 0; relu < 2; ++relu) {
    const fusedk_status st = fusedk_linear_lowrank_backward(&tdx, &tda, &tdb, &tdc, &tdn, &tdy, &tx, &twc2, &ta2, &tc,
                                                            &tid, relu ? &taux : NULL,
                                                            relu ? FUSEDK_ACT_RELU : FUSEDK_ACT_NONE, 2.0f, NULL);
    double h[QM][2][QR], g[QM][2][QR]; /* x a_q^T, and dz (2 b_q) where the row's id is q */
    double wdx[QM * QK] = {0}, wda[2 * QR * QK] = {0}, wdb[2 * QN * QR] = {0}, wdc[QM * QR] = {0}, wdn[QN] = {0};
    for (int m = 0; m < QM; ++m)
      for (int q = 0; q < 2; ++q)
        for (int j = 0; j < QR; ++j) {
          h[m][q][j] = g[m][q][j] = 0.0;
          for (int k = 0; ids[m] == q && k < QK; ++k) h[m][q][j] += (double)x[m * QK + k] * a2[(q * QR + j) * QK + k];
          for (int n = 0; ids[m] == q && n < QN; ++n)
            g[m][q][j] += (relu && aux[m * QN + n] <= 0 ? 0.0 : dy[m * QN + n]) * 2.0 * b2[(q * QN + n) * QR + j];
        }
    for (int m = 0; m < QM; ++m)
      for (int n = 0; n < QN; ++n) {
        const double dz = relu && aux[m * QN + n] <= 0 ? 0.0 : dy[m * QN + n];
        wdn[n] += dz;
        for (int k = 0; k < QK; ++k) wdx[m * QK + k] += dz * w[n * QK + k];
        for (int q = 0; q < 2; ++q)
          for (int j = 0; j < QR; ++j) wdb[(q * QN + n) * QR + j] += 2.0 * dz * h[m][q][j] * c[m * QR + j];
      }
    for (int m = 0; m < QM; ++m)
      for (int q = 0; q < 2; ++q)
        for (int j = 0; j < QR; ++j) {
          wdc[m * QR + j] += g[m][q][j] * h[m][q][j];
          for (int k = 0; k < QK; ++k) {
            wdx[m * QK + k] += g[m][q][j] * c[m * QR + j] * a2[(q * QR + j) * QK + k];
            wda[(q * QR + j) * QK + k] += g[m][q][j] * c[m * QR + j] * x[m * QK + k];
          }
        }
    ok = st == FUSEDK_OK;
    for (int i = 0; i < QM * QK; ++i) ok = ok && dx[i] == (float)wdx[i];
    for (int i = 0; i < 2 * QR * QK; ++i) ok = ok && da[i] == (float)wda[i];
    for (int i = 0; i < 2 * QN * QR; ++i) ok = ok && db[i] == (float)wdb[i];
    for (int i = 0; i < QM * QR; ++i) ok = ok && dc[i] == (float)wdc[i];
    for (int i = 0; i < QN; ++i) ok = ok && dbias[i] == (float)wdn[i];
    EXPECT(ok, "linear_lowrank_backward exact values, relu %d: %s (%s)", relu, fusedk_status_name(st),
           fusedk_failure_reason());
  }
  struct {
    const fusedk_tensor *dx, *db, *dc, *a, *codes, *aux;
    int act;
    float scaling;
    fusedk_status want;
    const char *says;
  } gbad[] = {
      {&tdx, &tdb, &tdc, &ta2, NULL, NULL, FUSEDK_ACT_NONE, 2, FUSEDK_ERR_INVALID_ARGUMENT, "dcodes is given but codes is NULL"},
      {&tdx, &tdbb, NULL, &ta2, &tc, NULL, FUSEDK_ACT_NONE, 2, FUSEDK_ERR_SHAPE, "db has shape [5, 3], expected [2, 5, 3]"},
      {&tdx, &tdb, NULL, &ta2, &tc, NULL, FUSEDK_ACT_GELU, 2, FUSEDK_ERR_INVALID_ARGUMENT, "aux is NULL"},
      {&tdx, &tdb, NULL, &ta2, &tc, NULL, FUSEDK_ACT_NONE, NAN, FUSEDK_ERR_INVALID_ARGUMENT, "scaling is nan"},
      {&tdx, &tdb, NULL, &ta, &tc, NULL, FUSEDK_ACT_NONE, 2, FUSEDK_ERR_SHAPE, "w_cat has shape [5, 20], expected [N, 12]"},
      {&tx, &tdb, NULL, &ta2, &tc, NULL, FUSEDK_ACT_NONE, 2, FUSEDK_ERR_LAYOUT, "output dx overlaps x in memory"},
  };
  for (size_t i = 0; i < sizeof gbad / sizeof gbad[0]; ++i) {
    for (int j = 0; j < 2 * QN * QR; ++j) db[j] = SENTINEL;
    const fusedk_status st = fusedk_linear_lowrank_backward(gbad[i].dx, NULL, gbad[i].db, gbad[i].dc, NULL, &tdy, &tx,
                                                            &twc2, gbad[i].a, gbad[i].codes, NULL, gbad[i].aux,
                                                            (fusedk_activation)gbad[i].act, gbad[i].scaling, NULL);
    int clean = 1;
    for (int j = 0; j < 2 * QN * QR; ++j) clean = clean && db[j] == SENTINEL;
    EXPECT(st == gbad[i].want && clean && strstr(fusedk_failure_reason(), "linear_lowrank_backward: ") &&
               strstr(fusedk_failure_reason(), gbad[i].says),
           "linear_lowrank_backward case %zu: %s, want %s (%s), db untouched %d", i, fusedk_status_name(st),
           fusedk_status_name(gbad[i].want), fusedk_failure_reason(), clean);
  }
  { /* stacked da whose adapters overlap (adapter stride K < r K): refused, nothing written */
    int64_t st3[3] = {QK, QK, 1};
    fusedk_tensor tdo = tda;
    tdo.strides = st3;
    for (int j = 0; j < 2 * QR * QK; ++j) da[j] = SENTINEL;
    const fusedk_status st = fusedk_linear_lowrank_backward(NULL, &tdo, NULL, NULL, NULL, &tdy, &tx, &twc2, &ta2, NULL,
                                                            NULL, NULL, FUSEDK_ACT_NONE, 2.0f, NULL);
    EXPECT(st == FUSEDK_ERR_LAYOUT && strstr(fusedk_failure_reason(), "da has an adapter stride of 4") &&
               da[0] == SENTINEL, "linear_lowrank_backward: overlapping da: %s", fusedk_failure_reason());
  }
}

/* lowrank_update_backward on small integers (exact): out = 2 ((x v) * codes) u_t */
static void lowrank_backward_cases(void) {
  enum { BM = 3, BK = 4, BR = 3, BN = 5 };
  static float x[BM * BK], v[BK * BR], c[BM * BR], u[BR * BN], d[BM * BN], dx[BM * BK], dv[BK * BR], du[BR * BN];
  static float dc[BM * BR];
  int64_t xs[2] = {BM, BK}, vs[2] = {BK, BR}, cs[2] = {BM, BR}, us[2] = {BR, BN}, ds[2] = {BM, BN}, vbad[2] = {BK, BR + 1};
  for (int i = 0; i < BM * BK; ++i) x[i] = (float)(i % 5) - 2.0f;
  for (int i = 0; i < BK * BR; ++i) v[i] = (float)(i % 3) - 1.0f;
  for (int i = 0; i < BM * BR; ++i) c[i] = (float)(i % 4) - 1.0f;
  for (int i = 0; i < BR * BN; ++i) u[i] = (float)(i % 7) - 3.0f;
  for (int i = 0; i < BM * BN; ++i) d[i] = (float)(i % 3) - 1.0f;
  fusedk_tensor tx = fusedk_tensor_cpu(x, FUSEDK_F32, 2, xs), tv = fusedk_tensor_cpu(v, FUSEDK_F32, 2, vs);
  fusedk_tensor tc = fusedk_tensor_cpu(c, FUSEDK_F32, 2, cs), tu = fusedk_tensor_cpu(u, FUSEDK_F32, 2, us);
  fusedk_tensor td = fusedk_tensor_cpu(d, FUSEDK_F32, 2, ds), tdx = fusedk_tensor_cpu(dx, FUSEDK_F32, 2, xs);
  fusedk_tensor tdv = fusedk_tensor_cpu(dv, FUSEDK_F32, 2, vs), tdu = fusedk_tensor_cpu(du, FUSEDK_F32, 2, us);
  fusedk_tensor tdc = fusedk_tensor_cpu(dc, FUSEDK_F32, 2, cs), tvb = fusedk_tensor_cpu(v, FUSEDK_F32, 2, vbad);
  for (int with_codes = 0; with_codes < 2; ++with_codes) {
    const fusedk_status st = fusedk_lowrank_update_backward(&tdx, &tdv, &tdu, with_codes ? &tdc : NULL, &td, &tx, &tv,
                                                            with_codes ? &tc : NULL, &tu, 2.0f, NULL);
    double h[BM * BR] = {0}, g[BM * BR] = {0};
    int ok = st == FUSEDK_OK;
    for (int m = 0; m < BM; ++m)
      for (int j = 0; j < BR; ++j) {
        for (int k = 0; k < BK; ++k) h[m * BR + j] += (double)x[m * BK + k] * v[k * BR + j];
        for (int n = 0; n < BN; ++n) g[m * BR + j] += 2.0 * d[m * BN + n] * u[j * BN + n];
      }
    for (int m = 0; m < BM; ++m)
      for (int j = 0; j < BR; ++j) {
        const double cj = with_codes ? c[m * BR + j] : 1.0;
        ok = ok && (!with_codes || dc[m * BR + j] == (float)(g[m * BR + j] * h[m * BR + j]));
        for (int k = 0; k < BK; ++k) {
          double want = 0.0;
          for (int i = 0; i < BR; ++i) want += g[m * BR + i] * (with_codes ? c[m * BR + i] : 1.0) * v[k * BR + i];
          ok = ok && dx[m * BK + k] == (float)want;
        }
        (void)cj;
      }
    for (int k = 0; k < BK; ++k)
      for (int j = 0; j < BR; ++j) {
        double want = 0.0;
        for (int m = 0; m < BM; ++m) want += (double)x[m * BK + k] * g[m * BR + j] * (with_codes ? c[m * BR + j] : 1.0);
        ok = ok && dv[k * BR + j] == (float)want;
      }
    for (int j = 0; j < BR; ++j)
      for (int n = 0; n < BN; ++n) {
        double want = 0.0;
        for (int m = 0; m < BM; ++m) want += 2.0 * h[m * BR + j] * (with_codes ? c[m * BR + j] : 1.0) * d[m * BN + n];
        ok = ok && du[j * BN + n] == (float)want;
      }
    EXPECT(ok, "lowrank_update_backward exact values, codes %d: %s (%s)", with_codes, fusedk_status_name(st),
           fusedk_failure_reason());
  }
  for (int i = 0; i < BK * BR; ++i) dv[i] = SENTINEL;
  fusedk_status st = fusedk_lowrank_update_backward(NULL, &tdv, NULL, &tdc, &td, &tx, &tv, NULL, &tu, 1.0f, NULL);
  EXPECT(st == FUSEDK_ERR_INVALID_ARGUMENT && strstr(fusedk_failure_reason(), "dcodes is given but codes is NULL") &&
             dv[0] == SENTINEL, "lowrank_update_backward: dcodes without codes: %s", fusedk_failure_reason());
  st = fusedk_lowrank_update_backward(NULL, &tdv, NULL, NULL, &td, &tx, &tvb, NULL, &tu, 1.0f, NULL);
  EXPECT(st == FUSEDK_ERR_SHAPE && strstr(fusedk_failure_reason(), "lowrank_update_backward: ") &&
             dv[0] == SENTINEL, "lowrank_update_backward: bad v: %s", fusedk_failure_reason());
  st = fusedk_lowrank_update_backward(&tdx, NULL, NULL, NULL, &tdx, &tx, &tv, NULL, &tu, 1.0f, NULL);
  EXPECT(st != FUSEDK_OK && dv[0] == SENTINEL, "lowrank_update_backward: dx as dout: %s", fusedk_failure_reason());
}

/* fusedk_op_out_shape for every output of every op, against shapes written out by hand: what
   every binding allocates. A case names its inputs' shapes, the attributes that differ from
   the registry's defaults and the outputs' shapes it expects, each by its registry name. */
typedef struct {
  int32_t op;
  const char *inputs, *attrs, *outputs; /* "name=2,3,16 name=5" ("name=7,3" for an attribute) */
} shape_case;

static const shape_case shape_cases[] = {
    {FUSEDK_OP_RMSNORM, "x=2,3,16 residual=2,3,16 weight=16", "", "y=2,3,16 residual_out=2,3,16"},
    {FUSEDK_OP_LAYERNORM, "x=2,3,16", "", "y=2,3,16"},
    {FUSEDK_OP_ADALN, "x=2,3,16 scale=2,16 shift=2,16", "", "y=2,3,16"},
    {FUSEDK_OP_RESIDUAL_TANH_GATED_RMSNORM, "x=2,3,16 x_res=2,3,16 gate=2,16", "", "y=2,3,16"},
    {FUSEDK_OP_ACT, "x=4,10", "", "y=4,10"},
    {FUSEDK_OP_SILU_FMA, "a=2,3,8 b=2,3,8 c=2,3,8", "", "y=2,3,8"},
    {FUSEDK_OP_GATED_RESIDUAL, "x=2,3,8 y=2,3,8 gate=2,8", "", "out=2,3,8"},
    {FUSEDK_OP_GLU, "x=2,3,16", "", "y=2,3,8"},
    {FUSEDK_OP_GLU_PAIR, "value=5,7 gate=5,7", "", "y=5,7"},
    {FUSEDK_OP_ROPE, "q=2,5,6,8 k=2,5,3,8 cos=5,4 sin=5,4", "", "q_out=2,5,6,8 k_out=2,5,3,8"},
    {FUSEDK_OP_ROPE_TABLE_1D, "positions=7", "dim=64", "cos=7,32 sin=7,32"},
    {FUSEDK_OP_ROPE_TABLE_AXES, "ids=7,3", "", "cos=7,64 sin=7,64"},
    {FUSEDK_OP_ROPE_TABLE_AXES, "ids=7,2", "axes_dim0=8 axes_dim1=12 axes_dim2=0", "cos=7,10 sin=7,10"},
    {FUSEDK_OP_ROPE_TABLE_LTX, "coords=7,3", "dim=48", "cos=7,24 sin=7,24"},
    {FUSEDK_OP_ROPE_TABLE_MIXED, "pos=7,3 freqs=3,4,10", "", "cos=7,4,10 sin=7,4,10"},
    {FUSEDK_OP_DIFFUSION_STEP, "x=2,4,8 cond=2,4,8 uncond=2,4,8", "", "out=2,4,8"},
    {FUSEDK_OP_QK_NORM_ROPE, "q=2,5,6,8 k=2,5,3,8 v=2,5,3,8 cos=5,4 sin=5,4", "",
     "q_out=2,6,5,8 k_out=2,3,5,8 v_out=2,3,5,8"},
    {FUSEDK_OP_QK_NORM_ROPE, "q=2,5,6,8 k=2,5,3,8 v=2,5,3,8 cos=5,4 sin=5,4", "layout=1",
     "q_out=2,5,6,8 k_out=2,5,3,8 v_out=2,5,3,8"},
    {FUSEDK_OP_LINEAR, "x=2,3,16 w=5,16 bias=5", "want_aux=1", "y=2,3,5 aux_out=2,3,5"},
    {FUSEDK_OP_LINEAR_BACKWARD, "dy=2,3,5 x=2,3,16 w=5,16", "", "dx=2,3,16 dw=5,16 db=5"},
    {FUSEDK_OP_ATTENTION, "q=2,9,6,64 k=2,11,3,64 v=2,11,3,64", "want_lse=1", "out=2,9,6,64 lse=2,6,9"},
    {FUSEDK_OP_ATTENTION_INT8, "q=2,9,6,64 k=2,11,3,64 v=2,11,3,64", "want_lse=1", "out=2,9,6,64 lse=2,6,9"},
    {FUSEDK_OP_LOWRANK_UPDATE, "x=4,7,16 v=16,8 u_t=8,24 y=4,7,24", "", "out=4,7,24"},
    {FUSEDK_OP_LOWRANK_PREPARE, "w=9,16 b=9,6", "", "w_cat=9,24"},
    {FUSEDK_OP_LOWRANK_PREPARE, "w=9,16 b=3,9,6", "", "w_cat=9,40"},
    {FUSEDK_OP_LINEAR_LOWRANK, "x=2,3,16 w_cat=9,24 a=6,16", "want_aux=1", "y=2,3,9 aux_out=2,3,9"},
    {FUSEDK_OP_LOWRANK_UPDATE_BACKWARD, "dout=4,24 x=4,16 v=16,8 codes=4,8 u_t=8,24", "",
     "dx=4,16 dv=16,8 du_t=8,24 dcodes=4,8"},
    {FUSEDK_OP_LINEAR_LOWRANK_BACKWARD, "dy=2,3,9 x=2,3,16 w_cat=9,24 a=6,16", "want_dbias=1",
     "dx=2,3,16 da=6,16 db=9,6 dbias=9"},
    {FUSEDK_OP_LINEAR_LOWRANK_BACKWARD, "dy=2,3,9 x=2,3,16 w_cat=9,40 a=3,6,16 codes=2,3,6", "",
     "dx=2,3,16 da=3,6,16 db=3,9,6 dcodes=2,3,6"},
    {FUSEDK_OP_ATTENTION_INT8_SCALED, "q=2,5,4,8 q_scale=2,5,4 k=2,7,2,8 k_scale=2,7,2 v=2,7,2,8", "want_lse=1",
     "out=2,5,4,8 lse=2,4,5"},
    {FUSEDK_OP_QK_NORM_ROPE_INT8, "q=2,5,4,8 k=2,5,2,8 cos=5,4 sin=5,4", "",
     "q_out=2,5,4,8 q_out_scale=2,5,4 k_out=2,5,2,8 k_out_scale=2,5,2"},
    {FUSEDK_OP_QUANTIZE_FP8, "x=2,5,24", "", "out=2,5,24 out_scale=2,5"},
    {FUSEDK_OP_QUANTIZE_FP8, "x=24", "", "out=24 out_scale=1"},
    {FUSEDK_OP_DEQUANTIZE_FP8, "x=3,2,5,16 x_scale=3,2,5", "out_dtype=1", "y=3,2,5,16"},
    {FUSEDK_OP_LINEAR_FP8, "x=2,7,32 x_scale=2,7 w=48,32 w_scale=48", "want_aux=1", "y=2,7,48 aux_out=2,7,48"},
    {FUSEDK_OP_RMSNORM_FP8, "x=2,3,16 residual=2,3,16", "", "y=2,3,16 y_scale=2,3 residual_out=2,3,16"},
    {FUSEDK_OP_LAYERNORM_FP8, "x=5,16", "", "y=5,16 y_scale=5"},
    {FUSEDK_OP_ADALN_FP8, "x=2,3,16 scale=2,16 shift=2,16", "", "y=2,3,16 y_scale=2,3"},
    {FUSEDK_OP_GLU_FP8, "x=2,5,24", "act=1 act_half=1", "out=2,5,12 out_scale=2,5"},
    {FUSEDK_OP_QUANTIZE_INT8, "x=48,32", "", "out=48,32 out_scale=48"},
    {FUSEDK_OP_LINEAR_W8, "x=2,7,32 w=48,32 w_scale=48", "want_aux=1", "y=2,7,48 aux_out=2,7,48"},
    {FUSEDK_OP_CONV, "x=2,9,7,5 w=6,3,3,5", "padding=1", "out=2,9,7,6"},
    {FUSEDK_OP_CONV, "x=2,9,7,5 w=6,3,3,5", "stride=2", "out=2,4,3,6"},
    {FUSEDK_OP_CONV, "x=1,5,9,8,4 w=3,3,1,3,4", "pad_t=2 padding=1 stride=2", "out=1,5,6,4,3"},
    {FUSEDK_OP_CONV, "x=1,5,9,8,4 w=3,3,3,3,4", "stride_t=2 pad_t=1 pad_t_back=1", "out=1,3,7,6,3"},
    {FUSEDK_OP_CONV, "x=2,9,7,5 w=6,3,3,5", "padding=1 upsample=2", "out=2,18,14,6"},
    {FUSEDK_OP_FOLD_BATCHNORM, "w=6,3,3,5 mean=6 var=6", "", "w_out=6,3,3,5 b_out=6"},
    {FUSEDK_OP_GROUP_NORM, "x=2,5,4,64 weight=64 bias=64", "groups=32", "y=2,5,4,64"},
    {FUSEDK_OP_CHANNEL_RMSNORM, "x=2,3,5,4,96 weight=96", "clamp=1", "y=2,3,5,4,96"},
    {FUSEDK_OP_CHANNEL_RMSNORM, "x=2,3,5,4,96 scale=2,96 shift=2,96", "", "y=2,3,5,4,96"},
};

/* The next "name=v,v,..." of *spec into name and v (at most FUSEDK_MAX_DIMS of them); 0 at the end. */
static int next_item(const char **spec, char *name, double *v, int *n) {
  int len = 0;
  while (**spec == ' ') ++*spec;
  if (!**spec || sscanf(*spec, "%31[a-z_0-9]=%n", name, &len) != 1 || !len) return 0;
  *spec += len;
  *n = 0;
  while (*n < FUSEDK_MAX_DIMS && sscanf(*spec, "%lf%n", &v[*n], &len) == 1) {
    ++*n, *spec += len;
    if (**spec != ',') break;
    ++*spec;
  }
  return 1;
}

static int tensor_index(const fusedk_op *o, const char *name) {
  for (int k = 0; k < o->n_tensors; ++k)
    if (!strcmp(o->tensors[k].name, name)) return k;
  return -1;
}

static void out_shape_cases(void) {
  int covered[FUSEDK_OP_COUNT][FUSEDK_OP_MAX_TENSORS] = {{0}};
  for (size_t c = 0; c < sizeof shape_cases / sizeof *shape_cases; ++c) {
    const shape_case *sc = &shape_cases[c];
    const fusedk_op *o = fusedk_op_get(sc->op);
    int64_t shapes[FUSEDK_OP_MAX_TENSORS][FUSEDK_MAX_DIMS];
    fusedk_tensor ts[FUSEDK_OP_MAX_TENSORS];
    const fusedk_tensor *t[FUSEDK_OP_MAX_TENSORS] = {0};
    double attrs[FUSEDK_OP_MAX_ATTRS], v[FUSEDK_MAX_DIMS];
    char name[32];
    int n;
    for (int k = 0; k < o->n_attrs; ++k) attrs[k] = o->attrs[k].value;
    for (const char *s = sc->attrs; next_item(&s, name, v, &n);) {
      int k = 0;
      while (k < o->n_attrs && strcmp(o->attrs[k].name, name)) ++k;
      EXPECT(k < o->n_attrs && n == 1, "shape case %d: %s has no attribute %s", (int)c, o->name, name);
      if (k < o->n_attrs) attrs[k] = v[0];
    }
    for (const char *s = sc->inputs; next_item(&s, name, v, &n);) {
      const int k = tensor_index(o, name);
      EXPECT(k >= 0 && o->tensors[k].kind <= FUSEDK_ARG_IN_OPT, "shape case %d: %s has no input %s", (int)c,
             o->name, name);
      if (k < 0) continue;
      for (int i = 0; i < n; ++i) shapes[k][i] = (int64_t)v[i];
      ts[k] = fusedk_tensor_cpu(NULL, FUSEDK_F32, n, shapes[k]);
      t[k] = &ts[k];
    }
    for (const char *s = sc->outputs; next_item(&s, name, v, &n);) {
      const int k = tensor_index(o, name);
      int64_t got[FUSEDK_MAX_DIMS];
      const int nd = k >= 0 ? fusedk_op_out_shape(sc->op, k, t, attrs, got) : -1;
      int same = nd == n;
      for (int i = 0; same && i < n; ++i) same = got[i] == (int64_t)v[i];
      EXPECT(same && fusedk_op_out_exists(sc->op, k, t, attrs), "shape case %d: %s's %s: ndim %d (%s)", (int)c,
             o->name, name, nd, nd < 0 ? fusedk_failure_reason() : "other sizes than expected");
      if (k >= 0) covered[sc->op][k] = 1;
    }
  }
  for (int i = 0; i < FUSEDK_OP_COUNT; ++i) /* every output of every op has a case */
    for (int k = 0; k < fusedk_op_get(i)->n_tensors; ++k)
      EXPECT(covered[i][k] || fusedk_op_get(i)->tensors[k].kind < FUSEDK_ARG_OUT, "no shape case for %s's %s",
             fusedk_op_get(i)->name, fusedk_op_get(i)->tensors[k].name);
}


/* FP8: quantize_fp8's values (exact cases, ties to even, subnormals, zero and NaN rows), its row
   scales' shapes, dequantize_fp8 and linear_fp8 against sums computed here, and their bad input */
static uint8_t e4m3_of(double v) { /* v exactly representable: its e4m3fn bits */
  const uint8_t sign = v < 0 ? 0x80 : 0;
  v = fabs(v);
  if (v < ldexp(1.0, -6)) return (uint8_t)(sign | (int)(v * 512.0));
  int e;
  const double f = frexp(v, &e);
  return (uint8_t)(sign | (e + 6) << 3 | ((int)(f * 16.0) - 8));
}
static double f64_of_e4m3(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double v = e ? ldexp(8 + m, e - 10) : ldexp(m, -9);
  return b & 0x80 ? -v : v;
}

static void fp8_cases(void) {
  enum { R = 4, K = 8 };
  /* row 0: amax 7, so x * 64 lands exactly; row 1: amax 448 (x as it is), ties to even at 17, 19,
     2^-10 and 3 2^-10; row 2: zeros; row 3: a NaN */
  static float x[R * K] = {1, -2, 0.5f, 3.5f, 0, 7, -7, 0.25f,
                           448, 17, 19, 0.0009765625f, 0.0029296875f, -17, 1, -448,
                           0, 0, 0, 0, 0, 0, 0, 0,
                           1, 2, 3, NAN, 4, 5, 6, 7};
  const double want[2][K] = {{64, -128, 32, 224, 0, 448, -448, 16}, {448, 16, 20, 0, 0.00390625, -16, 1, -448}};
  static uint8_t q[R * K];
  static float sc[R], y[R * K];
  int64_t xs[2] = {R, K}, ss[1] = {R};
  fusedk_tensor tx = fusedk_tensor_cpu(x, FUSEDK_F32, 2, xs), tq = fusedk_tensor_cpu(q, FUSEDK_E4M3, 2, xs);
  fusedk_tensor ts = fusedk_tensor_cpu(sc, FUSEDK_F32, 1, ss), ty = fusedk_tensor_cpu(y, FUSEDK_F32, 2, xs);
  fusedk_scaled_tensor sq = {&tq, &ts};
  fusedk_status st = fusedk_quantize_fp8(&sq, &tx, NULL);
  int ok = st == FUSEDK_OK && sc[0] == 7.0f / 448.0f && sc[1] == 1.0f && sc[2] == 0.0f && sc[3] != sc[3];
  for (int r = 0; r < 2; ++r)
    for (int k = 0; k < K; ++k) ok = ok && q[r * K + k] == e4m3_of(want[r][k]);
  for (int k = 0; k < K; ++k) ok = ok && q[2 * K + k] == 0 && (k == 3 ? (q[3 * K + k] & 0x7f) == 0x7f : q[3 * K + k] == 0);
  EXPECT(ok, "quantize_fp8: exact values, ties to even, zero and NaN rows: %s %s", fusedk_status_name(st),
         fusedk_failure_reason());
  st = fusedk_dequantize_fp8(&ty, &sq, NULL);
  ok = st == FUSEDK_OK;
  for (int i = 0; i < 2 * K; ++i) ok = ok && y[i] == (float)(f64_of_e4m3(q[i]) * sc[i / K]);
  EXPECT(ok && y[2 * K] == 0.0f && y[3 * K] != y[3 * K], "dequantize_fp8: %s %s", fusedk_status_name(st),
         fusedk_failure_reason());
  { /* random rows: within half a step of e4m3 (2^-4 relative, 2^-9 absolute) of x / scale */
    static float xr[64 * 24];
    static uint8_t qr[64 * 24];
    static float sr[64];
    int64_t rs[3] = {4, 16, 24}, rss[2] = {4, 16};
    for (int i = 0; i < 64 * 24; ++i) xr[i] = (float)(sin(1.3 * i) * exp(3.0 * cos(0.37 * i)));
    fusedk_tensor a = fusedk_tensor_cpu(xr, FUSEDK_F32, 3, rs), aq = fusedk_tensor_cpu(qr, FUSEDK_E4M3, 3, rs);
    fusedk_tensor as = fusedk_tensor_cpu(sr, FUSEDK_F32, 2, rss);
    const fusedk_scaled_tensor o = {&aq, &as};
    ok = fusedk_quantize_fp8(&o, &a, NULL) == FUSEDK_OK;
    for (int r = 0; ok && r < 64; ++r) {
      double amax = 0;
      for (int k = 0; k < 24; ++k) amax = fmax(amax, fabs(xr[r * 24 + k]));
      ok = sr[r] == (float)amax / 448.0f;
      for (int k = 0; k < 24; ++k) {
        const double v = xr[r * 24 + k] * (448.0 / amax), d = f64_of_e4m3(qr[r * 24 + k]);
        ok = ok && fabs(d - v) <= fmax(fabs(v) * 0.0625 * 1.001, ldexp(1.0, -10) * 1.001);
      }
    }
    EXPECT(ok, "quantize_fp8: random rows within half an e4m3 step");
  }
  { /* linear_fp8 (CPU) against sums here: M 3, K 8 (row 0, 1 of q), N 2 (rows 0 and 1 as w) */
    static uint16_t yb[3 * 2], bias[2] = {0x3f80, 0xbf00}; /* bf16 1, -0.5 */
    static float xsc[3] = {0.5f, 2.0f, 0.25f}, wsc[2] = {0.125f, 4.0f};
    int64_t ys[2] = {3, 2}, xds[2] = {3, K}, wds[2] = {2, K}, x1[1] = {3}, w1[1] = {2};
    fusedk_tensor txd = fusedk_tensor_cpu(q, FUSEDK_E4M3, 2, xds), twd = fusedk_tensor_cpu(q + K, FUSEDK_E4M3, 2, wds);
    fusedk_tensor txs = fusedk_tensor_cpu(xsc, FUSEDK_F32, 1, x1), tws = fusedk_tensor_cpu(wsc, FUSEDK_F32, 1, w1);
    fusedk_tensor tyb = fusedk_tensor_cpu(yb, FUSEDK_BF16, 2, ys), tb = fusedk_tensor_cpu(bias, FUSEDK_BF16, 1, w1);
    const fusedk_scaled_tensor sx = {&txd, &txs}, sw = {&twd, &tws};
    st = fusedk_linear_fp8(&tyb, NULL, &sx, &sw, &tb, FUSEDK_ACT_RELU, 1, NULL);
    ok = st == FUSEDK_OK;
    for (int m = 0; m < 3; ++m)
      for (int n = 0; n < 2; ++n) {
        double z = 0;
        for (int k = 0; k < K; ++k) z += f64_of_e4m3(q[m * K + k]) * f64_of_e4m3(q[(n + 1) * K + k]);
        z = z * xsc[m] * wsc[n] + (n ? -0.5 : 1.0);
        union { uint32_t u; float f; } v = {(uint32_t)yb[m * 2 + n] << 16};
        z = z > 0 ? z : 0;
        ok = ok && fabs(v.f - z) <= fabs(z) * 0.004;
      }
    EXPECT(ok, "linear_fp8 (CPU): relu(x w^T scales + bias): %s %s", fusedk_status_name(st), fusedk_failure_reason());
    /* bad input: each names its argument, nothing written */
    for (int i = 0; i < 6; ++i) yb[i] = 0x7777;
    fusedk_tensor bad = txd;
    bad.dtype = fusedk_dtype_of(FUSEDK_BF16);
    const fusedk_scaled_tensor bx = {&bad, &txs};
    st = fusedk_linear_fp8(&tyb, NULL, &bx, &sw, NULL, FUSEDK_ACT_NONE, 1, NULL);
    EXPECT(st == FUSEDK_ERR_DTYPE && strstr(fusedk_failure_reason(), "linear_fp8: x has dtype bfloat16, expected float8_e4m3fn"),
           "linear_fp8: bf16 x: %s", fusedk_failure_reason());
    const fusedk_scaled_tensor bs = {&txd, &tws};
    st = fusedk_linear_fp8(&tyb, NULL, &bs, &sw, NULL, FUSEDK_ACT_NONE, 1, NULL);
    EXPECT(st == FUSEDK_ERR_SHAPE && strstr(fusedk_failure_reason(), "x_scale has shape [2], expected [3]"),
           "linear_fp8: x_scale's shape: %s", fusedk_failure_reason());
    const fusedk_scaled_tensor bw = {&twd, &txs};
    st = fusedk_linear_fp8(&tyb, NULL, &sx, &bw, NULL, FUSEDK_ACT_NONE, 1, NULL);
    EXPECT(st == FUSEDK_ERR_SHAPE && strstr(fusedk_failure_reason(), "w_scale has shape [3], expected [2]"),
           "linear_fp8: w_scale's shape: %s", fusedk_failure_reason());
    fusedk_tensor y32 = fusedk_tensor_cpu(y, FUSEDK_F32, 2, ys);
    st = fusedk_linear_fp8(&y32, NULL, &sx, &sw, NULL, FUSEDK_ACT_NONE, 1, NULL);
    EXPECT(st == FUSEDK_ERR_DTYPE && strstr(fusedk_failure_reason(), "y has dtype float32, expected float16 or bfloat16"),
           "linear_fp8: float32 y: %s", fusedk_failure_reason());
    fusedk_tensor f16b = tb;
    f16b.dtype = fusedk_dtype_of(FUSEDK_F16);
    st = fusedk_linear_fp8(&tyb, NULL, &sx, &sw, &f16b, FUSEDK_ACT_NONE, 1, NULL);
    EXPECT(st == FUSEDK_ERR_DTYPE && strstr(fusedk_failure_reason(), "y has dtype bfloat16, expected float16 (the dtype of bias)"),
           "linear_fp8: bias of another dtype: %s", fusedk_failure_reason());
    const fusedk_tensor *t[7] = {&tyb, NULL, &txd, &txs, &twd, &tws, NULL};
    const double a16[4] = {FUSEDK_ACT_NONE, 0, FUSEDK_F16, 1}, a9[4] = {FUSEDK_ACT_NONE, 0, 9, 1};
    st = fusedk_op_call(FUSEDK_OP_LINEAR_FP8, t, a16, NULL);
    EXPECT(st == FUSEDK_ERR_DTYPE && strstr(fusedk_failure_reason(), "linear_fp8: y has dtype bfloat16, expected float16 (out_dtype)"),
           "linear_fp8: y unlike out_dtype: %s", fusedk_failure_reason());
    st = fusedk_op_call(FUSEDK_OP_LINEAR_FP8, t, a9, NULL);
    EXPECT(st == FUSEDK_ERR_INVALID_ARGUMENT && strstr(fusedk_failure_reason(), "out_dtype is 9"),
           "linear_fp8: out_dtype 9: %s", fusedk_failure_reason());
    ok = 1;
    for (int i = 0; i < 6; ++i) ok = ok && yb[i] == 0x7777;
    EXPECT(ok, "linear_fp8: bad calls write nothing");
    EXPECT(fusedk_op_out_scalar(FUSEDK_OP_LINEAR_FP8, 0, a16) == FUSEDK_F16 &&
               fusedk_op_out_scalar(FUSEDK_OP_QUANTIZE_FP8, 0, a16) == FUSEDK_E4M3 &&
               fusedk_op_out_scalar(FUSEDK_OP_QUANTIZE_FP8, 1, a16) == FUSEDK_F32 &&
               fusedk_op_out_scalar(FUSEDK_OP_RMSNORM, 0, a16) == -1,
           "op_out_scalar");
    int64_t shape[FUSEDK_MAX_DIMS];
    const fusedk_tensor *lt[7] = {NULL, NULL, &txd, &txs, &twd, &tws, NULL};
    EXPECT(fusedk_op_out_shape(FUSEDK_OP_LINEAR_FP8, 0, lt, a16, shape) == 2 && shape[0] == 3 && shape[1] == 2,
           "out_shape linear_fp8");
  }
  { /* the norms' FP8 forms: the plain op's float32 result, quantized here as quantize_fp8 does */
    static float nx[2 * 3 * 16], nr[2 * 3 * 16], nw[16], nb[16], nsc[2 * 16], nsh[2 * 16], ny[2 * 3 * 16], nro[2 * 3 * 16];
    static float ro8[2 * 3 * 16], ys[6];
    static uint8_t y8[2 * 3 * 16];
    int64_t s3[3] = {2, 3, 16}, s2[2] = {2, 16}, s1[1] = {16}, ss[2] = {2, 3};
    for (int i = 0; i < 96; ++i) nx[i] = (float)sin(0.37 * i) * 3.0f, nr[i] = (float)cos(0.21 * i);
    for (int i = 0; i < 32; ++i) nsc[i] = 0.1f * (float)(i % 5), nsh[i] = (float)(i % 3) - 1.0f;
    for (int i = 0; i < 16; ++i) nw[i] = 0.5f + (float)i / 16.0f, nb[i] = (float)(i % 4) / 4.0f;
    fusedk_tensor tx = fusedk_tensor_cpu(nx, FUSEDK_F32, 3, s3), tr = fusedk_tensor_cpu(nr, FUSEDK_F32, 3, s3);
    fusedk_tensor tw = fusedk_tensor_cpu(nw, FUSEDK_F32, 1, s1), tb = fusedk_tensor_cpu(nb, FUSEDK_F32, 1, s1);
    fusedk_tensor tsc = fusedk_tensor_cpu(nsc, FUSEDK_F32, 2, s2), tsh = fusedk_tensor_cpu(nsh, FUSEDK_F32, 2, s2);
    fusedk_tensor ty = fusedk_tensor_cpu(ny, FUSEDK_F32, 3, s3), tro = fusedk_tensor_cpu(nro, FUSEDK_F32, 3, s3);
    fusedk_tensor ty8 = fusedk_tensor_cpu(y8, FUSEDK_E4M3, 3, s3), tys = fusedk_tensor_cpu(ys, FUSEDK_F32, 2, ss);
    fusedk_tensor tro8 = fusedk_tensor_cpu(ro8, FUSEDK_F32, 3, s3);
    const fusedk_scaled_tensor sy = {&ty8, &tys};
    for (int op = 0; op < 3; ++op) {
      fusedk_status a = op == 0 ? fusedk_rmsnorm(&ty, &tro, &tx, &tr, &tw, 1e-6f, NULL)
                        : op == 1 ? fusedk_layernorm(&ty, &tx, &tw, &tb, 1e-5f, NULL)
                                  : fusedk_adaln(&ty, &tx, &tsc, &tsh, FUSEDK_NORM_LAYER, NULL, NULL, 1e-6f, NULL);
      fusedk_status b = op == 0 ? fusedk_rmsnorm_fp8(&sy, &tro8, &tx, &tr, &tw, 1e-6f, NULL)
                        : op == 1 ? fusedk_layernorm_fp8(&sy, &tx, &tw, &tb, 1e-5f, NULL)
                                  : fusedk_adaln_fp8(&sy, &tx, &tsc, &tsh, FUSEDK_NORM_LAYER, NULL, NULL, 1e-6f, NULL);
      ok = a == FUSEDK_OK && b == FUSEDK_OK && (op || !memcmp(nro, ro8, sizeof nro));
      for (int r = 0; ok && r < 6; ++r) {
        float amax = 0.0f;
        for (int d = 0; d < 16; ++d) amax = fmaxf(amax, fabsf(ny[r * 16 + d]));
        ok = ys[r] == amax / 448.0f;
        for (int d = 0; d < 16; ++d) {
          const double v = (double)(ny[r * 16 + d] * (448.0f / amax)), q = f64_of_e4m3(y8[r * 16 + d]);
          ok = ok && fabs(q - v) <= fmax(fabs(v) / 16.0, 1.0 / 1024.0);
        }
      }
      EXPECT(ok, "%s_fp8: the float32 result quantized: %s", op == 0 ? "rmsnorm" : op == 1 ? "layernorm" : "adaln",
             fusedk_failure_reason());
    }
    fusedk_tensor bad = ty8;
    bad.dtype = fusedk_dtype_of(FUSEDK_BF16);
    const fusedk_scaled_tensor sb = {&bad, &tys};
    fusedk_status st2 = fusedk_adaln_fp8(&sb, &tx, &tsc, &tsh, FUSEDK_NORM_LAYER, NULL, NULL, 1e-6f, NULL);
    EXPECT(st2 == FUSEDK_ERR_DTYPE && strstr(fusedk_failure_reason(), "adaln_fp8: y has dtype bfloat16, expected float8_e4m3fn"),
           "adaln_fp8: a bf16 y: %s", fusedk_failure_reason());
    fusedk_tensor over = fusedk_tensor_cpu(nx, FUSEDK_E4M3, 3, s3); /* y's bytes over x's first rows */
    const fusedk_scaled_tensor so = {&over, &tys};
    st2 = fusedk_layernorm_fp8(&so, &tx, NULL, NULL, 1e-5f, NULL);
    EXPECT(st2 == FUSEDK_ERR_LAYOUT && strstr(fusedk_failure_reason(), "layernorm_fp8: output y overlaps x"),
           "layernorm_fp8: y over x: %s", fusedk_failure_reason());
    const double bad_dt[4] = {0, 0, 0.5, 1}, no_dt[4] = {0, 0, 7, 1};
    EXPECT(fusedk_op_out_scalar(FUSEDK_OP_LINEAR_FP8, 0, bad_dt) == -1 &&
               fusedk_op_out_scalar(FUSEDK_OP_LINEAR_FP8, 0, no_dt) == -1, "op_out_scalar: out_dtype not a float dtype");
    st2 = fusedk_adaln_fp8(&sy, &tx, &tsc, &tsh, FUSEDK_NORM_RMS, NULL, &tb, 1e-6f, NULL);
    EXPECT(st2 == FUSEDK_ERR_INVALID_ARGUMENT && strstr(fusedk_failure_reason(), "adaln_fp8: bias is given with FUSEDK_NORM_RMS"),
           "adaln_fp8: rms with a bias: %s", fusedk_failure_reason());
  }
  { /* glu_fp8: byte for byte quantize_fp8 of glu's float32 result (both in double on the CPU), each
       act and half; odd widths, a wrong half and bad act_half refused by name */
    static float gx[3 * 2 * 40], gy[3 * 40], gs[3], gs2[3];
    static uint8_t g8[3 * 40], g82[3 * 40];
    int64_t sx[2] = {3, 80}, sy[2] = {3, 40}, s3[1] = {3}, sodd[2] = {3, 79};
    for (int i = 0; i < 240; ++i) gx[i] = (float)sin(0.53 * i) * 4.0f;
    fusedk_tensor tx = fusedk_tensor_cpu(gx, FUSEDK_F32, 2, sx), ty = fusedk_tensor_cpu(gy, FUSEDK_F32, 2, sy);
    fusedk_tensor t8 = fusedk_tensor_cpu(g8, FUSEDK_E4M3, 2, sy), ts = fusedk_tensor_cpu(gs, FUSEDK_F32, 1, s3);
    fusedk_tensor t82 = fusedk_tensor_cpu(g82, FUSEDK_E4M3, 2, sy), ts2 = fusedk_tensor_cpu(gs2, FUSEDK_F32, 1, s3);
    const fusedk_scaled_tensor o = {&t8, &ts}, o2 = {&t82, &ts2};
    for (int act = FUSEDK_ACT_GELU; act <= FUSEDK_ACT_RELU; ++act)
      for (int half = 0; half < 2; ++half) {
        ok = fusedk_glu(&ty, &tx, (fusedk_activation)act, (fusedk_glu_half)half, NULL) == FUSEDK_OK &&
             fusedk_quantize_fp8(&o2, &ty, NULL) == FUSEDK_OK &&
             fusedk_glu_fp8(&o, &tx, (fusedk_activation)act, (fusedk_glu_half)half, NULL) == FUSEDK_OK;
        EXPECT(ok && !memcmp(g8, g82, sizeof g8) && !memcmp(gs, gs2, sizeof gs) && gs[0] > 0.0f,
               "glu_fp8 act %d half %d: quantize_fp8 of glu's result: %s", act, half, fusedk_failure_reason());
      }
    fusedk_status st = fusedk_glu_fp8(&o, &tx, FUSEDK_ACT_SILU, (fusedk_glu_half)2, NULL);
    EXPECT(st == FUSEDK_ERR_INVALID_ARGUMENT && strstr(fusedk_failure_reason(), "glu_fp8: act_half is 2, expected"),
           "glu_fp8: act_half 2: %s", fusedk_failure_reason());
    memset(g8, 0x55, sizeof g8);
    st = fusedk_glu_fp8(&o, &tx, (fusedk_activation)-1, FUSEDK_GLU_FIRST, NULL); /* not quantize_fp8 of all of x */
    EXPECT(st == FUSEDK_ERR_INVALID_ARGUMENT && strstr(fusedk_failure_reason(), "glu_fp8: act is -1, expected") &&
               g8[0] == 0x55, "glu_fp8: act -1: %s", fusedk_failure_reason());
    fusedk_tensor odd = fusedk_tensor_cpu(gx, FUSEDK_F32, 2, sodd);
    st = fusedk_glu_fp8(&o, &odd, FUSEDK_ACT_SILU, FUSEDK_GLU_FIRST, NULL);
    EXPECT(st == FUSEDK_ERR_SHAPE && strstr(fusedk_failure_reason(), "glu_fp8: x has last dim 79, expected an even size"),
           "glu_fp8: an odd x: %s", fusedk_failure_reason());
    fusedk_tensor full = fusedk_tensor_cpu(g8, FUSEDK_E4M3, 2, sx);
    const fusedk_scaled_tensor of = {&full, &ts};
    st = fusedk_glu_fp8(&of, &tx, FUSEDK_ACT_SILU, FUSEDK_GLU_FIRST, NULL);
    EXPECT(st == FUSEDK_ERR_SHAPE && strstr(fusedk_failure_reason(), "glu_fp8: out has shape [3, 80], expected [3, 40]"),
           "glu_fp8: out as wide as x: %s", fusedk_failure_reason());
    const fusedk_tensor *gt[3] = {NULL, NULL, &tx};
    const double ga[2] = {FUSEDK_ACT_SILU, FUSEDK_GLU_FIRST};
    int64_t shape[FUSEDK_MAX_DIMS];
    EXPECT(fusedk_op_out_shape(FUSEDK_OP_GLU_FP8, 0, gt, ga, shape) == 2 && shape[1] == 40 &&
               fusedk_op_out_shape(FUSEDK_OP_GLU_FP8, 1, gt, ga, shape) == 1 && shape[0] == 3,
           "out_shape glu_fp8");
  }
  { /* the scales' shapes: x's leading dims, [1] for a 1-d x; a wrong one names out_scale */
    int64_t s1d[1] = {K}, one[1] = {1}, shape[FUSEDK_MAX_DIMS], x3[3] = {2, 2, K}, s2w[2] = {2, 2};
    fusedk_tensor v = fusedk_tensor_cpu(x, FUSEDK_F32, 1, s1d), vq = fusedk_tensor_cpu(q, FUSEDK_E4M3, 1, s1d);
    fusedk_tensor vs = fusedk_tensor_cpu(sc, FUSEDK_F32, 1, one);
    const fusedk_tensor *t1[3] = {NULL, NULL, &v};
    const double none[1] = {0};
    EXPECT(fusedk_op_out_shape(FUSEDK_OP_QUANTIZE_FP8, 1, t1, none, shape) == 1 && shape[0] == 1, "1-d scale shape");
    const fusedk_scaled_tensor o = {&vq, &vs};
    EXPECT(fusedk_quantize_fp8(&o, &v, NULL) == FUSEDK_OK && sc[0] == 7.0f / 448.0f, "quantize_fp8 of a 1-d x: %s",
           fusedk_failure_reason());
    fusedk_tensor x3t = fusedk_tensor_cpu(x, FUSEDK_F32, 3, x3), q3 = fusedk_tensor_cpu(q, FUSEDK_E4M3, 3, x3);
    fusedk_tensor s3t = fusedk_tensor_cpu(sc, FUSEDK_F32, 1, s2w);
    const fusedk_tensor *t3[3] = {NULL, NULL, &x3t};
    EXPECT(fusedk_op_out_shape(FUSEDK_OP_QUANTIZE_FP8, 1, t3, none, shape) == 2 && shape[0] == 2 && shape[1] == 2,
           "3-d x's scale shape");
    const fusedk_scaled_tensor o3 = {&q3, &s3t};
    st = fusedk_quantize_fp8(&o3, &x3t, NULL);
    EXPECT(st == FUSEDK_ERR_SHAPE && strstr(fusedk_failure_reason(), "quantize_fp8: out_scale has shape [2], expected [2, 2] (the leading dims of x)"),
           "quantize_fp8: a scale of the wrong shape: %s", fusedk_failure_reason());
    fusedk_tensor i8 = q3;
    i8.dtype = fusedk_dtype_of(FUSEDK_I8);
    s3t.ndim = 2;
    const fusedk_scaled_tensor o8 = {&i8, &s3t};
    st = fusedk_quantize_fp8(&o8, &x3t, NULL);
    EXPECT(st == FUSEDK_ERR_DTYPE && strstr(fusedk_failure_reason(), "quantize_fp8: out has dtype int8, expected float8_e4m3fn"),
           "quantize_fp8: int8 data: %s", fusedk_failure_reason());
    st = fusedk_quantize_fp8(NULL, &x3t, NULL);
    EXPECT(st == FUSEDK_ERR_INVALID_ARGUMENT && strstr(fusedk_failure_reason(), "out is NULL"),
           "quantize_fp8: no out: %s", fusedk_failure_reason());
  }
}

/* int8 weights: quantize_int8's values (exact cases, ties to even, zero and NaN rows) and
   linear_w8 against sums computed here in double, with its bad input */
static void int8_weight_cases(void) {
  enum { R = 4, K = 8, M = 3 };
  /* row 0: amax 127.5 (x as it is) with ties at 2.5, -3.5, 0.5, and +-127.5 (128 kept at 127,
     -128 kept); row 1: amax 255 (x / 2); row 2 zeros; row 3 a NaN */
  static float x[R * K] = {127.5f, 2.5f, -3.5f, 0.5f, -127.5f, 1, 0, 64,
                           255, 5, 7, -3, 1, 0, -255, 100,
                           0, 0, 0, 0, 0, 0, 0, 0,
                           1, 2, NAN, 3, 4, 5, 6, 7};
  const int8_t want[2][K] = {{127, 2, -4, 0, -128, 1, 0, 64}, {127, 2, 4, -2, 0, 0, -128, 50}};
  static int8_t q[R * K];
  static float sc[R];
  int64_t xs[2] = {R, K}, ss[1] = {R};
  fusedk_tensor tx = fusedk_tensor_cpu(x, FUSEDK_F32, 2, xs), tq = fusedk_tensor_cpu(q, FUSEDK_I8, 2, xs);
  fusedk_tensor ts = fusedk_tensor_cpu(sc, FUSEDK_F32, 1, ss);
  fusedk_scaled_tensor sq = {&tq, &ts};
  fusedk_status st = fusedk_quantize_int8(&sq, &tx, NULL);
  int ok = st == FUSEDK_OK && sc[0] == 1.0f && sc[1] == 2.0f && sc[2] == 0.0f && sc[3] != sc[3];
  for (int r = 0; r < 2; ++r)
    for (int k = 0; k < K; ++k) ok = ok && q[r * K + k] == want[r][k];
  for (int k = 0; k < K; ++k) ok = ok && q[2 * K + k] == 0 && q[3 * K + k] == 0;
  EXPECT(ok, "quantize_int8: exact values, ties to even, zero and NaN rows: %s %s", fusedk_status_name(st),
         fusedk_failure_reason());
  fusedk_tensor te = tq;
  te.dtype = fusedk_dtype_of(FUSEDK_E4M3);
  const fusedk_scaled_tensor se = {&te, &ts};
  st = fusedk_quantize_int8(&se, &tx, NULL);
  EXPECT(st == FUSEDK_ERR_DTYPE && strstr(fusedk_failure_reason(), "quantize_int8: out has dtype float8_e4m3fn, expected int8"),
         "quantize_int8: e4m3 data: %s", fusedk_failure_reason());
  { /* linear_w8 (CPU): x [3, 8] bf16, w rows 0 and 1 of q (N 2), gelu_tanh with aux_out */
    static uint16_t xb[M * K], yb[M * 2], ab[M * 2], bias[2] = {0x3f80, 0xbf00}; /* bf16 1, -0.5 */
    for (int i = 0; i < M * K; ++i) {
      union { float f; uint32_t u; } v = {(float)sin(0.7 * i + 0.3)};
      xb[i] = (uint16_t)(v.u >> 16); /* truncated: exact in bf16 */
    }
    int64_t x2[2] = {M, K}, y2[2] = {M, 2}, w2[2] = {2, K}, n1[1] = {2};
    fusedk_tensor txb = fusedk_tensor_cpu(xb, FUSEDK_BF16, 2, x2), tyb = fusedk_tensor_cpu(yb, FUSEDK_BF16, 2, y2);
    fusedk_tensor tab = fusedk_tensor_cpu(ab, FUSEDK_BF16, 2, y2), tb = fusedk_tensor_cpu(bias, FUSEDK_BF16, 1, n1);
    fusedk_tensor twd = fusedk_tensor_cpu(q, FUSEDK_I8, 2, w2), tws = fusedk_tensor_cpu(sc, FUSEDK_F32, 1, n1);
    const fusedk_scaled_tensor sw = {&twd, &tws};
    st = fusedk_linear_w8(&tyb, &tab, &txb, &sw, &tb, FUSEDK_ACT_GELU_TANH, NULL);
    ok = st == FUSEDK_OK;
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < 2; ++n) {
        double z = 0;
        for (int k = 0; k < K; ++k) {
          union { uint32_t u; float f; } v = {(uint32_t)xb[m * K + k] << 16};
          z += v.f * (double)q[n * K + k];
        }
        z = z * sc[n] + (n ? -0.5 : 1.0);
        const double g = 0.5 * z * (1 + tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)));
        union { uint32_t u; float f; } y = {(uint32_t)yb[m * 2 + n] << 16}, a = {(uint32_t)ab[m * 2 + n] << 16};
        ok = ok && fabs(y.f - g) <= fabs(g) * 0.004 + 1e-6 && fabs(a.f - z) <= fabs(z) * 0.004;
      }
    EXPECT(ok, "linear_w8 (CPU): gelu_tanh(x w^T scale + bias), aux: %s %s", fusedk_status_name(st), fusedk_failure_reason());
    /* bad input: each names its argument, nothing written */
    for (int i = 0; i < M * 2; ++i) yb[i] = 0x7777;
    const fusedk_scaled_tensor se8 = {&te, &tws};
    st = fusedk_linear_w8(&tyb, NULL, &txb, &se8, NULL, FUSEDK_ACT_NONE, NULL);
    EXPECT(st == FUSEDK_ERR_DTYPE && strstr(fusedk_failure_reason(), "linear_w8: w has dtype float8_e4m3fn, expected int8"),
           "linear_w8: e4m3 w: %s", fusedk_failure_reason());
    int64_t s3[1] = {3};
    fusedk_tensor t3 = fusedk_tensor_cpu(sc, FUSEDK_F32, 1, s3);
    const fusedk_scaled_tensor sw3 = {&twd, &t3};
    st = fusedk_linear_w8(&tyb, NULL, &txb, &sw3, NULL, FUSEDK_ACT_NONE, NULL);
    EXPECT(st == FUSEDK_ERR_SHAPE && strstr(fusedk_failure_reason(), "linear_w8: w_scale has shape [3], expected [2]"),
           "linear_w8: w_scale's shape: %s", fusedk_failure_reason());
    fusedk_tensor f16b = tb;
    f16b.dtype = fusedk_dtype_of(FUSEDK_F16);
    st = fusedk_linear_w8(&tyb, NULL, &txb, &sw, &f16b, FUSEDK_ACT_NONE, NULL);
    EXPECT(st == FUSEDK_ERR_DTYPE && strstr(fusedk_failure_reason(), "linear_w8: ") && strstr(fusedk_failure_reason(), "float16"),
           "linear_w8: bias of another dtype: %s", fusedk_failure_reason());
    int64_t k7[2] = {2, 7};
    fusedk_tensor tw7 = fusedk_tensor_cpu(q, FUSEDK_I8, 2, k7);
    const fusedk_scaled_tensor sw7 = {&tw7, &tws};
    st = fusedk_linear_w8(&tyb, NULL, &txb, &sw7, NULL, FUSEDK_ACT_NONE, NULL);
    EXPECT(st == FUSEDK_ERR_SHAPE && strstr(fusedk_failure_reason(), "linear_w8: w has shape [2, 7], expected [N, 8]"),
           "linear_w8: w's K: %s", fusedk_failure_reason());
    st = fusedk_linear_w8(&tyb, NULL, &txb, NULL, NULL, FUSEDK_ACT_NONE, NULL);
    EXPECT(st == FUSEDK_ERR_INVALID_ARGUMENT && strstr(fusedk_failure_reason(), "linear_w8: w is NULL"),
           "linear_w8: no w: %s", fusedk_failure_reason());
    st = fusedk_linear_w8(&tyb, NULL, &txb, &sw, NULL, (fusedk_activation)9, NULL);
    EXPECT(st == FUSEDK_ERR_INVALID_ARGUMENT && strstr(fusedk_failure_reason(), "linear_w8: act is 9"),
           "linear_w8: act 9: %s", fusedk_failure_reason());
    ok = 1;
    for (int i = 0; i < M * 2; ++i) ok = ok && yb[i] == 0x7777;
    EXPECT(ok, "linear_w8: bad calls write nothing");
    int64_t shape[FUSEDK_MAX_DIMS];
    const fusedk_tensor *lt[6] = {NULL, NULL, &txb, &twd, &tws, NULL};
    const double a0[2] = {FUSEDK_ACT_NONE, 0};
    EXPECT(fusedk_op_out_shape(FUSEDK_OP_LINEAR_W8, 0, lt, a0, shape) == 2 && shape[0] == M && shape[1] == 2 &&
               fusedk_op_out_scalar(FUSEDK_OP_QUANTIZE_INT8, 0, a0) == FUSEDK_I8,
           "out_shape linear_w8, out_scalar quantize_int8");
  }
}

int main(void) {
  for (int i = 0; i < N; ++i) bx[i] = bres[i] = (float)sin(i + 1.0);
  for (int i = 0; i < D; ++i) bw[i] = bb[i] = 0.5f;
  for (int i = 0; i < B * 6 * D; ++i) bsc[i] = 0.1f;
  for (int i = 0; i < B * D; ++i) bsh[i] = bg[i] = 0.2f;

  EXPECT(strcmp(fusedk_version(), "0.12.0") == 0, "version %s", fusedk_version());
  EXPECT(strcmp(fusedk_status_name(FUSEDK_ERR_LAYOUT), "FUSEDK_ERR_LAYOUT") == 0, "status name");
  EXPECT(FUSEDK_ERR_OUT_OF_MEMORY == 10 && FUSEDK_ERR_NO_CUDA == 7, "status values are fixed");
  char info[4096];
  size_t n = fusedk_kernel_info(info, sizeof info);
  EXPECT(n > 0 && n < sizeof info && strstr(info, "\"rmsnorm\"") && strstr(info, "\"version\": \"0.12.0\""),
         "kernel_info: %s", info);

  for (int op = OP_RMS; op <= OP_MOCHI; ++op) cases_for((op_t)op);
  int8_weight_cases();
  registry_cases();
  out_shape_cases();
  attention_cases();
  attention_scaled_cases();
  qk_int8_cases();
  fp8_cases();
  lowrank_cases();
  linear_lowrank_cases();
  lowrank_backward_cases();
  empty_and_dtype_cases();
  fuzz_findings();
  printf("%d passed, %d failed\n", checks - failures, failures);
  return failures ? 1 : 0;
}
