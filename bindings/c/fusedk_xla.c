/* fusedk_xla.c - every op of the registry as an XLA FFI handler (jax.ffi.ffi_call, XLA custom
   calls), for fusedk.jax.

   Two handlers, generic over the registry (fusedk_op_get): fusedk_xla_cpu for XLA:CPU (runs the
   C reference) and fusedk_xla_cuda for XLA:GPU (runs the kernel on XLA's stream). fusedk.jax
   registers one target per op ("fusedk_rmsnorm", ...), all with the same handler; the call
   says which op through its attributes:
     op       int32  the registry id
     present  int32  bit i set: optional input i (registry index) is given
     <attr>   the op's attributes by registry name: FUSEDK_ATTR_F32 -> float32 scalar,
              FUSEDK_ATTR_I32 -> int32 scalar; a missing one takes the registry default.
   Operands: the inputs that are given, in registry order. Results: the outputs that exist, in
   registry order. XLA hands compact row-major buffers (the default layout of ffi_call).

   Written against fusedk_xla_api.h, our layout-identical copy of the part of XLA's C API used
   here, so the library builds without jaxlib. Compiled into libfusedk by meson; not part of
   the two-file drop-in. */
#define FUSEDK__INTERNAL
#include "fusedk.h"
#include "fusedk_xla_api.h"

#include <stdio.h>
#include <string.h>

#ifdef FUSEDK_CUDA
/* cudart (linked into libfusedk with FUSEDK_CUDA); cudaError_t is an int-sized enum */
extern int cudaGetDevice(int *device);
#endif

/* XLA's API table has `field`: the table is long enough (its struct_size), and, for functions
   that came late and sit where older tables had others, the runtime is of our version or later
   (the table has been reordered within major 0 before; minors append). */
#define API_HAS(api, field) ((api)->struct_size >= FXLA_STRUCT_SIZE(FXLA_Api, field) && (api)->field)
#define API_HAS_LATE(api, field)                                                            \
  (API_HAS(api, field) && (api)->api_version.major_version == FXLA_API_MAJOR &&            \
   (api)->api_version.minor_version >= FXLA_API_MINOR)

/* An XLA error carrying this thread's fusedk failure: "fusedk: <reason> [<status>]" (the form of
   fusedk.Error's message; fusedk.jax parses it back). */
static FXLA_Error *xla_error(const FXLA_Api *api, fusedk_status st) {
  if (!api || !API_HAS(api, FXLA_Error_Create))
    return NULL; /* nothing to report with; cannot happen with an XLA that calls handlers */
  char msg[640];
  snprintf(msg, sizeof msg, "fusedk: %s [%s]", fusedk_failure_reason(), fusedk_status_name(st));
  FXLA_Error_Create_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = FXLA_Error_Create_Args_STRUCT_SIZE;
  a.message = msg; /* XLA copies it */
  a.errc = st == FUSEDK_ERR_CUDA || st == FUSEDK_ERR_CUBLAS ? FXLA_Error_Code_INTERNAL
           : st == FUSEDK_ERR_OUT_OF_MEMORY                 ? FXLA_Error_Code_RESOURCE_EXHAUSTED
                                                            : FXLA_Error_Code_INVALID_ARGUMENT;
  return api->FXLA_Error_Create(&a);
}

/* XLA's metadata query (at registration): the API version this handler was built against, and
   its traits. Answered as xla/ffi/api/api.h's handlers answer it. */
static FXLA_Error *metadata(const FXLA_CallFrame *f, FXLA_Handler_Traits traits) {
  FXLA_Metadata_Extension *e = (FXLA_Metadata_Extension *)f->extension_start;
  if (e->extension_base.struct_size < FXLA_Metadata_Extension_STRUCT_SIZE || !e->metadata ||
      e->metadata->struct_size < FXLA_Metadata_STRUCT_SIZE)
    return xla_error(f->api, fusedk__fail(FUSEDK_ERR_UNSUPPORTED, "xla: metadata query with unexpected struct "
                                          "sizes; check the installed jax/jaxlib versions"));
  FXLA_Metadata *m = e->metadata;
  m->api_version.struct_size = FXLA_Api_Version_STRUCT_SIZE;
  m->api_version.extension_start = NULL;
  m->api_version.major_version = FXLA_API_MAJOR;
  m->api_version.minor_version = FXLA_API_MINOR;
  m->traits = traits;
  /* state_type_id: stateless, XLA_FFI_UNKNOWN_TYPE_ID (0). XLA zero-initializes it; it lies
     past XLA's own STRUCT_SIZE, so it is written only where struct_size says it exists. */
  if (m->struct_size >= FXLA_STRUCT_SIZE(FXLA_Metadata, state_type_id)) m->state_type_id.type_id = 0;
  return NULL;
}

static const char *dtype_name(FXLA_DataType t) {
  switch (t) {
    case FXLA_DataType_PRED: return "bool";
    case FXLA_DataType_S8: return "int8";
    case FXLA_DataType_S16: return "int16";
    case FXLA_DataType_S32: return "int32";
    case FXLA_DataType_S64: return "int64";
    case FXLA_DataType_U8: return "uint8";
    case FXLA_DataType_U16: return "uint16";
    case FXLA_DataType_U32: return "uint32";
    case FXLA_DataType_U64: return "uint64";
    case FXLA_DataType_F16: return "float16";
    case FXLA_DataType_F32: return "float32";
    case FXLA_DataType_F64: return "float64";
    case FXLA_DataType_BF16: return "bfloat16";
    case FXLA_DataType_C64: return "complex64";
    case FXLA_DataType_C128: return "complex128";
    case FXLA_DataType_F8E4M3FN: return "float8_e4m3fn";
    default: return NULL;
  }
}

/* A scalar attribute as a double (float32 and int32 as fusedk.jax passes them; also float64,
   int64 and bool, which other callers of ffi_call may give). 0 if it is not one. */
static int scalar_value(FXLA_AttrType type, const void *attr, double *v) {
  const FXLA_Scalar *s = (const FXLA_Scalar *)attr;
  if (type != FXLA_AttrType_SCALAR || !s || !s->value) return 0;
  switch (s->dtype) {
    case FXLA_DataType_F32: *v = *(const float *)s->value; return 1;
    case FXLA_DataType_F64: *v = *(const double *)s->value; return 1;
    case FXLA_DataType_S32: *v = *(const int32_t *)s->value; return 1;
    case FXLA_DataType_S64: *v = (double)*(const int64_t *)s->value; return 1;
    case FXLA_DataType_PRED: *v = *(const uint8_t *)s->value ? 1.0 : 0.0; return 1;
    default: return 0;
  }
}

static int name_is(const FXLA_ByteSpan *n, const char *s) {
  size_t k = strlen(s);
  return n && n->ptr && n->len == k && !memcmp(n->ptr, s, k);
}

/* v is an int32 (NaN, fractions and out-of-range values are not; their casts would be UB) */
static int is_int32(double v) { return v >= -2147483648.0 && v <= 2147483647.0 && v == (double)(int32_t)v; }

/* A buffer (operand or result) as a compact fusedk tensor on `dev`. */
static fusedk_status tensor_of(const char *op, const char *name, int is_buffer, void *arg, fusedk_device dev,
                               fusedk_tensor *t) {
  const FXLA_Buffer *b = (const FXLA_Buffer *)arg;
  if (!is_buffer || !b || b->struct_size < FXLA_Buffer_STRUCT_SIZE)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: %s is not an XLA buffer", op, name);
  static const fusedk_dtype f32 = {FUSEDK_DTYPE_FLOAT, 32, 1}, f16 = {FUSEDK_DTYPE_FLOAT, 16, 1},
                            bf16 = {FUSEDK_DTYPE_BFLOAT, 16, 1}, i32 = {FUSEDK_DTYPE_INT, 32, 1},
                            i8 = {FUSEDK_DTYPE_INT, 8, 1}, e4m3 = {FUSEDK_DTYPE_FLOAT8_E4M3FN, 8, 1};
  if (b->dtype == FXLA_DataType_F32) t->dtype = f32;
  else if (b->dtype == FXLA_DataType_S32) t->dtype = i32; /* index arguments (kv_len): the op checks where */
  else if (b->dtype == FXLA_DataType_S8) t->dtype = i8;   /* scaled tensors' data: the op checks where */
  else if (b->dtype == FXLA_DataType_F8E4M3FN) t->dtype = e4m3;
  else if (b->dtype == FXLA_DataType_F16) t->dtype = f16;
  else if (b->dtype == FXLA_DataType_BF16) t->dtype = bf16;
  else {
    const char *dn = dtype_name(b->dtype);
    char num[32];
    if (!dn) {
      snprintf(num, sizeof num, "XLA type %d", (int)b->dtype);
      dn = num;
    }
    return fusedk__fail(FUSEDK_ERR_DTYPE, "%s: %s has dtype %s, expected float32, float16 or bfloat16", op, name, dn);
  }
  /* the op validates ndim 1..FUSEDK_MAX_DIMS and names the tensor; only keep it in int32 here */
  if (b->rank < 0 || b->rank > 1024 || (b->rank > 0 && !b->dims))
    return fusedk__fail(FUSEDK_ERR_SHAPE, "%s: %s has rank %lld, expected 1..%d", op, name, (long long)b->rank,
                        FUSEDK_MAX_DIMS);
  t->data = b->data;
  t->device = dev;
  t->ndim = (int32_t)b->rank;
  t->shape = b->dims; /* XLA's sizes, alive for the call */
  t->strides = NULL;  /* compact row-major */
  t->byte_offset = 0;
  return FUSEDK_OK;
}

/* Decodes the call frame into an op's tensors and attributes, and runs the op. */
static fusedk_status run(const FXLA_CallFrame *f, fusedk_device dev, struct CUstream_st *stream) {
  const FXLA_Attrs *at = &f->attrs;
  if (at->size < 0 || (at->size > 0 && (!at->types || !at->names || !at->attrs)))
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "xla: malformed attributes");
  /* op and present first: the rest are named by the op */
  double v = -1.0, mask = 0.0;
  int have_op = 0;
  for (int64_t i = 0; i < at->size; ++i) {
    if (name_is(at->names[i], "op")) {
      if (!scalar_value(at->types[i], at->attrs[i], &v))
        return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "xla: attribute op is not an int32 scalar");
      have_op = 1;
    } else if (name_is(at->names[i], "present") && !scalar_value(at->types[i], at->attrs[i], &mask)) {
      return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "xla: attribute present is not an int32 scalar");
    }
  }
  if (!have_op) return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "xla: no attribute op (the registry id of the op)");
  const int32_t id = is_int32(v) ? (int32_t)v : -1;
  const fusedk_op *o = fusedk_op_get(id);
  if (!o)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "xla: attribute op is %g, expected a registry id 0..%d", v,
                        FUSEDK_OP_COUNT - 1);
  if (!is_int32(mask) || mask < 0)
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: attribute present is %g, expected a bitmask", o->name, mask);
  const uint32_t present = (uint32_t)mask;

  double attrs[FUSEDK_OP_MAX_ATTRS] = {0};
  for (int k = 0; k < o->n_attrs; ++k) attrs[k] = o->attrs[k].value;
  for (int64_t i = 0; i < at->size; ++i) {
    if (name_is(at->names[i], "op") || name_is(at->names[i], "present")) continue;
    int k = 0;
    while (k < o->n_attrs && !name_is(at->names[i], o->attrs[k].name)) ++k;
    const FXLA_ByteSpan *n = at->names[i];
    const int len = n && n->ptr ? (int)(n->len < 64 ? n->len : 64) : 0;
    if (k == o->n_attrs)
      return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: unknown attribute '%.*s'", o->name, len, len ? n->ptr : "");
    const int f32 = o->attrs[k].type == FUSEDK_ATTR_F32;
    if (!scalar_value(at->types[i], at->attrs[i], &attrs[k]) || (!f32 && !is_int32(attrs[k])))
      return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: attribute %s is not a%s scalar", o->name,
                          o->attrs[k].name, f32 ? " float32" : "n int32");
  }

  /* which inputs are given and which outputs exist */
  int given[FUSEDK_OP_MAX_TENSORS], n_in = 0, n_out = 0;
  for (int i = 0; i < o->n_tensors; ++i) {
    const fusedk_op_tensor *a = &o->tensors[i];
    given[i] = a->kind == FUSEDK_ARG_IN || (a->kind == FUSEDK_ARG_IN_OPT && ((present >> i) & 1u));
    n_in += given[i];
  }
  const fusedk_tensor *in[FUSEDK_OP_MAX_TENSORS], given_mark = {0}; /* only NULL or not is read */
  for (int i = 0; i < o->n_tensors; ++i) in[i] = given[i] ? &given_mark : NULL;
  for (int i = 0; i < o->n_tensors; ++i) {
    given[i] |= fusedk_op_out_exists(id, i, in, attrs); /* the registry's rule; 0 for inputs */
    n_out += o->tensors[i].kind >= FUSEDK_ARG_OUT && given[i];
  }
  if (f->args.size != n_in || (n_in && (!f->args.types || !f->args.args)))
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: XLA passed %lld operands, expected %d (the given inputs "
                        "in registry order)", o->name, (long long)f->args.size, n_in);
  if (f->rets.size != n_out || (n_out && (!f->rets.types || !f->rets.rets)))
    return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: XLA expects %lld results, the op has %d", o->name,
                        (long long)f->rets.size, n_out);

  fusedk_tensor t[FUSEDK_OP_MAX_TENSORS];
  const fusedk_tensor *tp[FUSEDK_OP_MAX_TENSORS];
  int k[2] = {0, 0}; /* operands, results taken */
  for (int pass = 0; pass < 2; ++pass) /* inputs first: a dtype error names the input, not y */
    for (int i = 0; i < o->n_tensors; ++i) {
      if (pass == 0) tp[i] = NULL;
      if (!given[i] || (o->tensors[i].kind >= FUSEDK_ARG_OUT) != pass) continue;
      const int buf = pass ? f->rets.types[k[1]] == FXLA_RetType_BUFFER : f->args.types[k[0]] == FXLA_ArgType_BUFFER;
      void *arg = pass ? f->rets.rets[k[1]] : f->args.args[k[0]];
      ++k[pass];
      fusedk_status st = tensor_of(o->name, o->tensors[i].name, buf, arg, dev, &t[i]);
      if (st) return st;
      tp[i] = &t[i];
    }
  return fusedk_op_call(id, tp, attrs, stream);
}

/* Checks shared by both handlers; 1 = answered (*err set), 0 = go on and execute. */
static int preamble(FXLA_CallFrame *f, FXLA_Handler_Traits traits, FXLA_Error **err) {
  *err = NULL;
  if (!f) return 1;
  /* XLA's api.h requires exactly its CallFrame size; fields are only ever appended, so we
     accept any frame that holds the ones read here */
  if (f->struct_size < FXLA_CallFrame_STRUCT_SIZE) {
    *err = xla_error(f->api, fusedk__fail(FUSEDK_ERR_UNSUPPORTED, "xla: call frame of %zu bytes, expected >= %zu; "
                                          "check the installed jax/jaxlib versions", f->struct_size,
                                          (size_t)FXLA_CallFrame_STRUCT_SIZE));
    return 1;
  }
  if (f->extension_start && f->extension_start->type == FXLA_Extension_Metadata) {
    *err = metadata(f, traits);
    return 1;
  }
  return f->stage != FXLA_ExecutionStage_EXECUTE; /* registered for execute only; nothing to prepare */
}

FUSEDK_DEF FXLA_Error *fusedk_xla_cpu(FXLA_CallFrame *f) {
  FXLA_Error *err;
  if (preamble(f, 0, &err)) return err;
  const fusedk_device cpu = {FUSEDK_DEVICE_CPU, 0};
  fusedk_status st = run(f, cpu, NULL);
  return st ? xla_error(f->api, st) : NULL;
}

/* The kernels are stream-ordered and capturable (what linear and attention keep between calls is
   made on a stream's first call, in the relaxed capture mode): XLA may record the call into a
   CUDA graph (command buffer). */
FUSEDK_DEF FXLA_Error *fusedk_xla_cuda(FXLA_CallFrame *f) {
  FXLA_Error *err;
  if (preamble(f, FXLA_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE, &err)) return err;
  const FXLA_Api *api = f->api;
  if (!api || !API_HAS(api, FXLA_Stream_Get))
    return xla_error(api, fusedk__fail(FUSEDK_ERR_UNSUPPORTED, "xla: this XLA's API has no XLA_FFI_Stream_Get"));

  FXLA_Stream_Get_Args sa;
  memset(&sa, 0, sizeof sa);
  sa.struct_size = FXLA_Stream_Get_Args_STRUCT_SIZE;
  sa.ctx = f->ctx;
  if ((err = api->FXLA_Stream_Get(&sa))) return err; /* XLA's own error, handed back */

  /* the device: XLA's ordinal where this API has it, else the thread's current device */
  fusedk_device dev = {FUSEDK_DEVICE_CUDA, 0};
  int have_ordinal = 0;
  if (API_HAS_LATE(api, FXLA_DeviceOrdinal_Get)) {
    FXLA_DeviceOrdinal_Get_Args da;
    memset(&da, 0, sizeof da);
    da.struct_size = FXLA_DeviceOrdinal_Get_Args_STRUCT_SIZE;
    da.ctx = f->ctx;
    FXLA_Error *e = api->FXLA_DeviceOrdinal_Get(&da);
    if (!e && da.device_ordinal >= 0) {
      dev.device_id = da.device_ordinal;
      have_ordinal = 1;
    } else if (e && API_HAS(api, FXLA_Error_Destroy)) {
      FXLA_Error_Destroy_Args d;
      memset(&d, 0, sizeof d);
      d.struct_size = FXLA_Error_Destroy_Args_STRUCT_SIZE;
      d.error = e;
      api->FXLA_Error_Destroy(&d);
    }
  }
#ifdef FUSEDK_CUDA
  if (!have_ordinal) {
    int d = 0;
    if (cudaGetDevice(&d) == 0) dev.device_id = d;
  }
#else
  (void)have_ordinal; /* without the GPU half the op reports FUSEDK_ERR_NO_CUDA */
#endif
  fusedk_status st = run(f, dev, (struct CUstream_st *)sa.stream);
  return st ? xla_error(api, st) : NULL;
}

/* The XLA FFI API version the handlers answer XLA's metadata query with, as MAJOR*1000+MINOR:
   fusedk.jax compares it with jaxlib's before registering (a handler XLA rejects at backend
   start-up would stop the backend from starting). */
FUSEDK_DEF int32_t fusedk_xla_api_version(void) { return FXLA_API_MAJOR * 1000 + FXLA_API_MINOR; }
