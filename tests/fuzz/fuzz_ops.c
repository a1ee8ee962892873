/* libFuzzer target over every op's validation and CPU path (fusedk_op_call), with ASan and
   UBSan (tests/fuzz/run.sh builds and runs it). The fuzzer's bytes pick the op, then for each
   registry argument: absent or present, the shape its role implies or a mutated one (ndim 0-9,
   sizes 0, huge, negative), compact or explicit strides (negative, zero, padded, huge), a dtype
   (the call's, float32, another, lanes, codes DLPack has none of), a device, a byte offset, and
   where it lies in one arena of host memory between guard bytes; then the attributes (defaults,
   edge values, NaN, Inf). A tensor whose described memory does not fit the arena gets a NULL
   data pointer (the C API trusts the caller for bounds; the fuzzer only claims memory it owns).
   Properties, each a trap when broken:
   - no crash, no sanitizer report;
   - a refusal has a status in range and a reason that starts with the op's name and names one of
     its arguments or attributes; it writes nothing (the arena and its guards are unchanged);
   - an accepted call writes only inside its outputs' described memory (and linear_lowrank's x
     with room for h, whose room is the call's to write), and each output's shape is the one
     fusedk_op_out_shape gives for the inputs (what every binding allocates by). */
#define FUSEDK_IMPLEMENTATION
#include "fusedk.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ARENA = 1 << 14, GUARD = 256, NT = FUSEDK_OP_MAX_TENSORS, ND = FUSEDK_MAX_DIMS + 1 };
static unsigned char mem[GUARD + ARENA + GUARD], before[sizeof mem];

typedef struct { const uint8_t *p; size_t n; } bytes;
static unsigned u8(bytes *b) { return b->n ? (b->n--, *b->p++) : 0; }

static int64_t size_of(bytes *b, int64_t natural) {
  const unsigned v = u8(b);
  if (v < 200) return natural; /* mostly what the role implies */
  switch (v % 8) {
    case 0: return 0;
    case 1: return 1;
    case 2: return (int64_t)1 << 40;
    case 3: return -3;
    case 4: return natural + 1;
    case 5: return natural > 1 ? natural - 1 : 2;
    default: return 1 + v % 9;
  }
}

static fusedk_dtype dtype_of(bytes *b, int scalar) {
  const unsigned v = u8(b);
  fusedk_dtype d = fusedk_dtype_of((fusedk_scalar)scalar);
  if (v < 224) return d;
  switch (v % 8) {
    case 0: return fusedk_dtype_of(FUSEDK_F32);
    case 1: return fusedk_dtype_of(FUSEDK_F16);
    case 2: return fusedk_dtype_of(FUSEDK_BF16);
    case 3: d.bits = 64; return d; /* float64 */
    case 4: d.code = 0; d.bits = 32; return d; /* int32 */
    case 5: d.lanes = 2; return d;
    case 6: d.code = 3; d.bits = 64; return d; /* opaque */
    default: d.code = 9; d.bits = 8; return d; /* no DLPack code */
  }
}

static int64_t esize(fusedk_dtype d) { return d.bits >= 8 ? (int64_t)(d.bits / 8) * (d.lanes ? d.lanes : 1) : 1; }

/* the byte range [lo, hi) element 0 +- strides reach; 0 if it cannot be computed in range */
static int extent(const fusedk_tensor *t, int64_t *lo, int64_t *hi, int *empty) {
  __int128 a = 0, z = 0, st = 1;
  *empty = 0;
  if (t->ndim < 0 || t->ndim > ND) return 0;
  for (int i = t->ndim - 1; i >= 0; --i) {
    const int64_t n = t->shape[i];
    if (n < 0) return 0;
    if (n == 0) *empty = 1;
    const __int128 s = t->strides ? t->strides[i] : st;
    if (n > 0 && s < 0) a += s * (n - 1);
    if (n > 0 && s > 0) z += s * (n - 1);
    st *= n > 0 ? n : 1;
    if (st > ((__int128)1 << 60) || a < -((__int128)1 << 60) || z > ((__int128)1 << 60)) return 0;
  }
  const int64_t e = esize(t->dtype);
  *lo = (int64_t)(a * e), *hi = (int64_t)(z * e + e);
  return 1;
}

/* the natural shape of argument k from its role: the reference's, its last dim (halved), [B, D] */
static int natural(const fusedk_op *o, int k, const fusedk_tensor *ref, int64_t *sh) {
  const fusedk_op_tensor *a = &o->tensors[k];
  const int nd = ref->ndim;
  switch (a->role) {
    case FUSEDK_ROLE_ROW: memcpy(sh, ref->shape, (size_t)nd * sizeof *sh); return nd;
    case FUSEDK_ROLE_ROW_HALF: memcpy(sh, ref->shape, (size_t)nd * sizeof *sh); sh[nd - 1] /= 2; return nd;
    case FUSEDK_ROLE_COLUMN: sh[0] = ref->shape[nd - 1]; return 1;
    case FUSEDK_ROLE_SAMPLE: sh[0] = ref->shape[0], sh[1] = ref->shape[nd - 1]; return 2;
    default: break;
  }
  /* the op's own shapes, from the reference (q [B, S, H, Dh], x [M, K], dy [M, N], positions) */
  const char *n = a->name;
  const int64_t *r = ref->shape, last = r[nd - 1];
  if (!strcmp(n, "k") || !strcmp(n, "v") || !strcmp(n, "aux")) { memcpy(sh, r, (size_t)nd * sizeof *sh); return nd; }
  if (nd == 4 && (!strcmp(n, "cos") || !strcmp(n, "sin"))) { sh[0] = r[1], sh[1] = last / 2; return 2; }
  if (nd == 4 && (!strcmp(n, "q_weight") || !strcmp(n, "k_weight"))) { sh[0] = last; return 1; }
  if (!strcmp(n, "ids") || !strcmp(n, "coords") || !strcmp(n, "pos")) { sh[0] = r[0], sh[1] = 3; return 2; }
  if (!strcmp(n, "freqs")) { sh[0] = 3, sh[1] = 2, sh[2] = 4; return 3; }
  if (!strcmp(n, "scale") || !strcmp(n, "shift")) { sh[0] = r[0], sh[1] = last; return 2; } /* [N, C] */
  if (!strcmp(n, "w") && nd >= 1) { sh[0] = 1 + (last * 7) % 5, sh[1] = last; return 2; }
  return 0; /* left to the bytes */
}

/* a broken property: what the call was and what it said, then a trap (the fuzzer's crash) */
#define BROKEN(what)                                                                                     \
  do {                                                                                                 \
    fprintf(stderr, "fuzz_ops: %s: op %d (%s), status %s, reason '%s'\n", what, op, o ? o->name : "-", \
            fusedk_status_name(st), fusedk_failure_reason());                                          \
    __builtin_trap();                                                                                  \
  } while (0)

static const double EDGE[] = {0.0, -1.0, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 7.0, 1e-6, 2.5, 8.0, 12.0, 64.0, 1e30, -1e30};

/* tensor x of rank nd over `shape`: dtype, device, strides, and where in the arena (NULL data
   where its memory would not fit) */
static void make_tensor(bytes *b, fusedk_tensor *x, int nd, int64_t *shape, int64_t *strides, int fixed,
                        int scalar) {
  *x = fusedk_tensor_cpu(NULL, FUSEDK_F32, nd, shape);
  x->dtype = dtype_of(b, fixed >= 0 ? fixed : scalar);
  const unsigned dv = u8(b);
  if (dv >= 240) x->device.device_type = (int32_t[]){FUSEDK_DEVICE_CUDA, FUSEDK_DEVICE_CUDA_HOST, 7, 13}[dv % 4];
  if (dv == 239) x->device.device_id = 1;
  if (u8(b) >= 192) { /* explicit strides: padded rows, or each one from the bytes */
    const unsigned how = u8(b);
    int64_t acc = 1;
    for (int i = nd - 1; i >= 0; --i) {
      const int64_t sz = shape[i] > 0 && shape[i] < 64 ? shape[i] : 1;
      strides[i] = how % 2 ? acc : (int64_t)(int8_t)u8(b);
      if (how % 2 && i == nd - 1 && how % 4 == 3) strides[i] = 2; /* a strided last dim */
      if (u8(b) == 255) strides[i] = (int64_t)1 << 50;
      acc *= sz + (i == nd - 1 ? (int64_t)(how / 4 % 4) : 0);
    }
    x->strides = strides;
  }
  const unsigned misalign = u8(b) >= 248 ? 1 + u8(b) % 3 : 0;
  int64_t lo, hi;
  int empty;
  if (extent(x, &lo, &hi, &empty) && hi - lo + (int64_t)misalign <= ARENA) {
    const int64_t room = ARENA - (hi - lo) - (int64_t)misalign;
    const unsigned hi8 = u8(b);
    const int64_t at = room > 0 ? (int64_t)((hi8 << 8 | u8(b)) % (unsigned)(room + 1)) : 0;
    const int64_t e = esize(x->dtype);
    int64_t base = GUARD + at - lo + (int64_t)misalign; /* element 0, bytes into mem */
    if (!misalign) base -= base % (e > 16 ? 16 : e); /* aligned unless asked not to be */
    if (base + lo < GUARD) base += e;
    if (base + hi <= GUARD + ARENA) {
      x->data = mem + base;
      if (u8(b) >= 224) x->byte_offset = (uint64_t)(u8(b) % 4) * (uint64_t)e, x->data = mem + base - x->byte_offset;
    }
  }
  if (empty && u8(b) >= 128) x->data = NULL; /* an empty tensor without data */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  bytes b = {data, size};
  const unsigned pick = u8(&b);
  const int op = pick == 255 ? -1 : pick == 254 ? FUSEDK_OP_COUNT : (int)(pick % FUSEDK_OP_COUNT);
  const fusedk_op *o = fusedk_op_get(op);
  static int64_t shp[NT][ND], str[NT][ND];
  fusedk_tensor t[NT];
  const fusedk_tensor *p[NT];
  memset(t, 0, sizeof t);
  for (int i = 0; i < (int)sizeof mem; ++i) mem[i] = (unsigned char)(i * 131u + 7u); /* finite-ish data */
  const int scalar = (int)(u8(&b) % 3);
  double attrs[FUSEDK_OP_MAX_ATTRS];
  for (int a = 0; a < FUSEDK_OP_MAX_ATTRS; ++a) {
    const unsigned v = u8(&b);
    attrs[a] = o && a < o->n_attrs ? o->attrs[a].value : 0.0;
    if (v >= 176) attrs[a] = v >= 252 ? (double[]){NAN, INFINITY, -INFINITY, 1e-300}[v - 252] : EDGE[v % 16];
  }
  int n = o ? o->n_tensors : 4;
  int ref = -1;
  for (int k = 0; k < n; ++k) p[k] = NULL;
  for (int pass = 0; pass < 2; ++pass) /* inputs, then outputs shaped by the op's rule */
    for (int k = 0; k < n; ++k) {
      const int is_out = o && o->tensors[k].kind >= FUSEDK_ARG_OUT;
      if (is_out != pass) continue;
      const unsigned mode = u8(&b);
      const int required = !o || o->tensors[k].kind == FUSEDK_ARG_IN || o->tensors[k].kind == FUSEDK_ARG_OUT;
      if (mode % 16 == 0 || (!required && mode % 2)) continue; /* absent */
      fusedk_tensor *x = &t[k];
      int nd = 0;
      if (is_out) {
        nd = fusedk_op_out_shape(op, k, p, attrs, shp[k]);
        if (nd < 0) nd = 0;
      } else if (ref >= 0) {
        nd = natural(o, k, &t[ref], shp[k]);
      } else if (o && o->row_ndim > 0) { /* the reference: the op's rank */
        nd = o->row_ndim;
        for (int i = 0; i < nd; ++i) shp[k][i] = 1 + u8(&b) % 8;
        if (nd == 4) shp[k][3] = 2 * (1 + u8(&b) % 8); /* an even head dim */
      }
      const int nn = nd;
      if (!nd) nd = 1 + (int)(u8(&b) % 4); /* a shape of its own */
      if (u8(&b) >= 240) nd = (int)(u8(&b) % (ND + 1)); /* another rank, 0..9 */
      for (int i = nn; i < nd; ++i) shp[k][i] = 1 + u8(&b) % 8;
      for (int i = 0; i < nd; ++i) shp[k][i] = size_of(&b, shp[k][i]);
      make_tensor(&b, x, nd, shp[k], str[k], o ? o->tensors[k].scalar : -1, scalar);
      p[k] = x;
      if (ref < 0 && o && o->tensors[k].kind == FUSEDK_ARG_IN && nd > 0) ref = k;
    }
  memcpy(before, mem, sizeof mem);
  const fusedk_status st = fusedk_op_call(op, p, attrs, NULL);
  const char *why = fusedk_failure_reason();
  static int stats = -1; /* FUZZ_STATS=1: a line per call (op, status), to see what the corpus reaches */
  if (stats < 0) stats = getenv("FUZZ_STATS") != NULL;
  if (stats) fprintf(stderr, "call %s %s\n", o ? o->name : "(bad id)", fusedk_status_name(st));
  if (st < FUSEDK_OK || st > FUSEDK_ERR_OUT_OF_MEMORY) BROKEN("status out of range");
  if (st != FUSEDK_OK) {
    if (!why || !*why) BROKEN("a refusal without a reason");
    if (memcmp(mem, before, sizeof mem)) BROKEN("a refused call wrote");
    if (!o) return 0;
    const size_t ln = strlen(o->name);
    if (strncmp(why, o->name, ln) || strncmp(why + ln, ": ", 2)) BROKEN("the reason does not start with the op");
    int named = 0;
    for (int k = 0; k < o->n_tensors && !named; ++k) named = strstr(why + ln, o->tensors[k].name) != NULL;
    for (int a = 0; a < o->n_attrs && !named; ++a) { /* axes_dim0..3 is the C argument axes_dim[] */
      char nm[64];
      snprintf(nm, sizeof nm, "%s", o->attrs[a].name);
      for (size_t e = strlen(nm); e > 1 && nm[e - 1] >= '0' && nm[e - 1] <= '9';) nm[--e] = 0;
      named = strstr(why + ln, nm) != NULL;
    }
    const int about_build = st == FUSEDK_ERR_NO_CUDA || st == FUSEDK_ERR_CUDA || st == FUSEDK_ERR_CUBLAS ||
                            st == FUSEDK_ERR_OUT_OF_MEMORY; /* the build or the machine, not an argument */
    if (!named && !about_build) BROKEN("the reason names no argument or attribute");
    return 0;
  }
  if (!o) BROKEN("a bad op id was accepted");
  /* accepted: writes only inside the outputs' memory; outputs have the shape the rule gives */
  static unsigned char mine[sizeof mem];
  memset(mine, 0, sizeof mine);
  for (int k = 0; k < n; ++k) {
    if (!p[k] || o->tensors[k].kind < FUSEDK_ARG_OUT || !t[k].data) continue;
    int64_t lo, hi;
    int empty;
    if (!extent(&t[k], &lo, &hi, &empty)) BROKEN("an accepted output without a computable extent");
    const int64_t base = (unsigned char *)t[k].data + t[k].byte_offset - mem;
    if (!empty) memset(mine + base + lo, 1, (size_t)(hi - lo));
    int64_t want[FUSEDK_MAX_DIMS];
    const int32_t wn = fusedk_op_out_shape(op, k, p, attrs, want);
    if (wn != t[k].ndim) BROKEN("an accepted output of another rank than fusedk_op_out_shape gives");
    for (int i = 0; i < wn; ++i)
      if (want[i] != t[k].shape[i]) BROKEN("an accepted output of another shape than fusedk_op_out_shape gives");
  }
  if (op == FUSEDK_OP_LINEAR_LOWRANK && p[2] && p[5] && t[2].data && t[2].ndim >= 1 && t[5].ndim >= 2) {
    /* x with room for h ([..., K + A rp], K a's last dim): its last A rp columns are the call's to write */
    const fusedk_tensor *a = &t[5];
    const int64_t K = a->shape[a->ndim - 1], r = a->shape[a->ndim - 2], A = a->ndim == 3 ? a->shape[0] : 1;
    int64_t lo, hi;
    int empty;
    if (t[2].shape[t[2].ndim - 1] == K + A * ((r + 7) / 8 * 8) && extent(&t[2], &lo, &hi, &empty) && !empty)
      memset(mine + ((unsigned char *)t[2].data + t[2].byte_offset - mem) + lo, 1, (size_t)(hi - lo));
  }
  for (size_t i = 0; i < sizeof mem; ++i)
    if (!mine[i] && mem[i] != before[i]) BROKEN("a write outside every output");
  return 0;
}
