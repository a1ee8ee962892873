/* fusedk_py.c - the fast call path of the Python bindings, in C, without Python.h.

   A Python call on framework tensors costs what the framework's own op costs only if nothing in
   it goes through Python objects per tensor: no __dlpack__ capsules, no output buffers allocated
   outside the framework's allocator, no stream objects. DLPack's C exchange API (dlpack.h >= 1.2:
   a framework type's __dlpack_c_exchange_api__, torch >= 2.11) gives all of it in C: a DLTensor
   view of each argument, outputs from the framework's own allocator, the framework's current
   stream, and the result handed back as the framework's tensor. Its functions take PyObject* and
   need the GIL, so the bindings call fusedk_py_call through ctypes.PyDLL (which keeps the GIL;
   cffi releases it) and hand over, once, the few CPython entry points used here. Nothing here
   needs Python's headers or links against libpython.

   Also here: fusedk_op_call_packed, the path of arrays without the exchange API (NumPy, CuPy):
   the bindings pack each array's pointer, shape and byte strides into one buffer.

   Compiled into libfusedk by meson; not part of the two-file drop-in. */
#define FUSEDK__INTERNAL
#include "fusedk.h"

#include <stdio.h>
#include <string.h>

#if defined(_MSC_VER)
#define FUSEDK__PY_TLS __declspec(thread)
#else
#define FUSEDK__PY_TLS __thread
#endif

/* DLPackExchangeAPI (dlpack.h 1.2/1.3), layout-identical: the versioned header, then five
   functions in this order. */
typedef struct fusedk_xapi {
  uint32_t major, minor;
  void *prev_api;
  int (*allocator)(fusedk_tensor *prototype, fusedk_dlmanaged_versioned **out, void *error_ctx,
                   void (*set_error)(void *error_ctx, const char *kind, const char *message));
  int (*managed_from_py)(void *py_object, fusedk_dlmanaged_versioned **out);
  int (*managed_to_py)(fusedk_dlmanaged_versioned *tensor, void **out_py_object);
  int (*view_from_py)(void *py_object, fusedk_tensor *out); /* may be NULL */
  int (*current_stream)(int32_t device_type, int32_t device_id, void **out_stream);
} fusedk_xapi;

/* The CPython entry points this file uses, from the bindings (ctypes.pythonapi), in this order. */
static struct {
  void *none;
  void (*incref)(void *);
  void (*decref)(void *);
  void *(*tuple_new)(intptr_t);
  int (*tuple_setitem)(void *, intptr_t, void *); /* steals the item */
  void *(*tuple_getitem)(void *, intptr_t);       /* borrowed */
  intptr_t (*tuple_size)(void *);
  void (*err_clear)(void);
  void *(*getattr)(void *, const char *);         /* PyObject_GetAttrString: a new reference */
  long long (*as_longlong)(void *);
  void *(*dict_getitem)(void *, void *);          /* PyDict_GetItem: borrowed, no error set */
  void *(*call)(void *, void *, void *);          /* PyObject_Call */
  int (*isinstance)(void *, void *);
} py;

static FUSEDK__PY_TLS int last; /* the last fusedk_py_call's status, or -1: left to the generic path */

/* fns: Py_None, then the functions of the struct above, in its order. */
FUSEDK_DEF void fusedk_py_init(void *const *fns, int n) {
  if (n * sizeof(void *) == sizeof py) memcpy(&py, fns, sizeof py);
}

/* The status of this thread's last fusedk_py_call, or -1 where it left the call to the generic
   path: an argument the exchange API cannot view (another framework's array, a list, a scalar). */
FUSEDK_DEF int fusedk_py_last(void) { return last; }

/* The failure value: None (a new reference); fusedk_failure_reason() says why. */
static void *failed(int status) {
  last = status;
  py.incref(py.none);
  return py.none;
}

typedef struct { const char *op, *name; } alloc_ctx;

static void alloc_error(void *ctx, const char *kind, const char *message) {
  const alloc_ctx *c = (const alloc_ctx *)ctx;
  const int oom = (kind && strstr(kind, "Memory")) || (message && strstr(message, "out of memory"));
  fusedk__fail(oom ? FUSEDK_ERR_OUT_OF_MEMORY : FUSEDK_ERR_INVALID_ARGUMENT,
               "%s: allocating %s through the framework's allocator failed: %s: %s", c->op, c->name,
               kind ? kind : "error", message ? message : "");
}

static int is_gpu(int32_t t) { return t == FUSEDK_DEVICE_CUDA || t == FUSEDK_DEVICE_CUDA_MANAGED; }

/* Returns the outputs that exist, in registry order: the caller's out= objects, or the new ones
   (made[i]: handed back through the exchange API; else obj[i] already holds a new reference). */
static void *results(const fusedk_op *o, const fusedk_tensor *const *t, void *const *obj,
                     fusedk_dlmanaged_versioned *const *made, const fusedk_xapi *x, const int *owned, int n_out) {
  void *res = n_out > 1 ? py.tuple_new(n_out) : NULL, *one = NULL;
  int k = 0;
  for (int i = 0; i < o->n_tensors; ++i) {
    const fusedk_op_tensor *a = &o->tensors[i];
    if (a->kind < FUSEDK_ARG_OUT || !t[i]) continue;
    void *r = obj[i];
    if (made && made[i]) {
      if (x->managed_to_py(made[i], &r) != 0) { /* the tensor was written but cannot be handed back */
        py.err_clear();
        r = py.none;
        fusedk__fail(FUSEDK_ERR_OUT_OF_MEMORY, "%s: handing %s back to the framework failed", o->name, a->name);
      }
      if (r == py.none) py.incref(r);
    } else if (!owned || !owned[i]) { /* the caller's out=: returned as a new reference */
      py.incref(r);
    }
    if (res) py.tuple_setitem(res, k++, r);
    else one = r;
  }
  last = FUSEDK_OK;
  return res ? res : one;
}

/* Runs registry op `op` on `args`, a tuple of the op's tensors in registry order (None = an
   absent input, or an output to allocate), through `x`, the exchange API of the first input's
   type. stream < 0: the framework's current stream of that input's device. Returns a new
   reference: the output, or a tuple of the outputs that exist; None on failure, with the
   failure reason and fusedk_py_last() set. */
FUSEDK_DEF void *fusedk_py_call(int32_t op, const fusedk_xapi *x, void *args, double a0, double a1, double a2,
                                double a3, int64_t stream) {
  const fusedk_op *o = fusedk_op_get(op);
  if (!o || !x || !x->view_from_py) return failed(-1);
  fusedk_tensor view[FUSEDK_OP_MAX_TENSORS];
  const fusedk_tensor *t[FUSEDK_OP_MAX_TENSORS];
  fusedk_dlmanaged_versioned *made[FUSEDK_OP_MAX_TENSORS] = {0};
  void *obj[FUSEDK_OP_MAX_TENSORS];
  const fusedk_tensor *ref = NULL;
  for (int i = 0; i < o->n_tensors; ++i) {
    obj[i] = py.tuple_getitem(args, i);
    if (!obj[i]) { py.err_clear(); return failed(-1); }
    if (obj[i] == py.none) obj[i] = NULL;
    t[i] = NULL;
    if (!obj[i]) continue;
    if (x->view_from_py(obj[i], &view[i]) != 0) { /* not this framework's tensor */
      py.err_clear();
      return failed(-1);
    }
    t[i] = &view[i];
    if (!ref && o->tensors[i].kind <= FUSEDK_ARG_IN_OPT) ref = t[i];
  }
  int n_out = 0;
  fusedk_status status = FUSEDK_OK;
  for (int i = 0; i < o->n_tensors; ++i) {
    const fusedk_op_tensor *a = &o->tensors[i];
    if (a->kind < FUSEDK_ARG_OUT || (a->kind == FUSEDK_ARG_OUT_OPT && !t[a->when])) continue;
    ++n_out;
    if (t[i]) continue; /* out= given */
    if (!t[a->like]) return failed(-1); /* a required input is missing: the generic path says which */
    fusedk_tensor proto = *t[a->like];
    proto.strides = NULL, proto.byte_offset = 0, proto.data = NULL;
    alloc_ctx ctx = {o->name, a->name};
    if (x->allocator(&proto, &made[i], &ctx, alloc_error) != 0 || !made[i]) {
      made[i] = NULL;
      py.err_clear();
      status = FUSEDK_ERR_OUT_OF_MEMORY;
      break;
    }
    t[i] = &made[i]->dl_tensor;
  }
  if (status == FUSEDK_OK) {
    void *s = (void *)(intptr_t)stream;
    if (stream < 0) {
      s = NULL;
      if (ref && is_gpu(ref->device.device_type) && x->current_stream(ref->device.device_type, ref->device.device_id, &s)) {
        py.err_clear();
        s = NULL;
      }
    }
    const double attrs[FUSEDK_OP_MAX_ATTRS] = {a0, a1, a2, a3};
    status = fusedk_op_call(op, t, attrs, (struct CUstream_st *)s);
  }
  if (status != FUSEDK_OK) {
    for (int i = 0; i < o->n_tensors; ++i)
      if (made[i] && made[i]->deleter) made[i]->deleter(made[i]);
    return failed(status);
  }
  return results(o, t, obj, made, x, NULL, n_out);
}

/* --- arrays read through their attributes (CuPy) -----------------------------------------
   A framework without the exchange API whose arrays say where they are as CuPy's do: .data.ptr,
   .data.device_id, .shape, .strides (bytes), .dtype. Read here rather than in Python, where the
   same reads and the packing cost more than CuPy's own cupy.add call. */

static long long attr_ll(void *o, const char *name, int *err) {
  void *v = py.getattr(o, name);
  if (!v) return *err = 1, 0;
  long long r = py.as_longlong(v);
  py.decref(v);
  if (r == -1) *err = 1; /* -1 is an error, or a value no device pointer, ordinal or size has */
  return r;
}

/* 0, or -1 where the generic path should look at it (it reports what is wrong). dtypes maps a
   dtype to code | bits << 8 | lanes << 16. */
static int attrs_view(void *obj, void *dtypes, fusedk_tensor *v, int64_t *dims) {
  int err = 0;
  void *data = py.getattr(obj, "data"), *dt = py.getattr(obj, "dtype");
  void *shape = py.getattr(obj, "shape"), *strides = py.getattr(obj, "strides");
  void *code = dt ? py.dict_getitem(dtypes, dt) : NULL;
  long long ptr = data ? attr_ll(data, "ptr", &err) : 0, dev = data ? attr_ll(data, "device_id", &err) : 0;
  long long c = code ? py.as_longlong(code) : -1;
  intptr_t n = shape ? py.tuple_size(shape) : -1;
  int ok = data && dt && shape && strides && !err && c >= 0 && n >= 0 && n <= FUSEDK_MAX_DIMS &&
           py.tuple_size(strides) == n;
  const int64_t item = ((c >> 8) & 0xff) / 8 * ((c >> 16) & 0xffff);
  for (intptr_t d = 0; ok && d < n; ++d) {
    dims[d] = py.as_longlong(py.tuple_getitem(shape, d));
    const long long b = py.as_longlong(py.tuple_getitem(strides, d));
    ok = dims[d] >= 0 && item > 0 && b % item == 0;
    dims[n + d] = b / (item > 0 ? item : 1);
  }
  void *refs[4] = {data, dt, shape, strides};
  for (int k = 0; k < 4; ++k)
    if (refs[k]) py.decref(refs[k]);
  if (!ok) {
    py.err_clear();
    return -1;
  }
  v->data = (void *)(intptr_t)ptr;
  v->device.device_type = FUSEDK_DEVICE_CUDA, v->device.device_id = (int32_t)dev;
  v->ndim = (int32_t)n;
  v->dtype.code = (uint8_t)(c & 0xff), v->dtype.bits = (uint8_t)((c >> 8) & 0xff), v->dtype.lanes = (uint16_t)(c >> 16);
  v->shape = dims, v->strides = dims + n, v->byte_offset = 0;
  return 0;
}

/* Runs registry op `op` on `args` (as fusedk_py_call) whose arrays are instances of `type`; a
   missing output is `type(like.shape, like.dtype)` (CuPy: from its memory pool on the current
   device). stream: the stream to run on. GIL held. */
FUSEDK_DEF void *fusedk_py_call_attrs(int32_t op, void *type, void *dtypes, void *args, double a0, double a1, double a2,
                                      double a3, int64_t stream) {
  const fusedk_op *o = fusedk_op_get(op);
  if (!o) return failed(-1);
  fusedk_tensor view[FUSEDK_OP_MAX_TENSORS];
  const fusedk_tensor *t[FUSEDK_OP_MAX_TENSORS] = {0};
  int64_t dims[FUSEDK_OP_MAX_TENSORS][2 * FUSEDK_MAX_DIMS];
  void *obj[FUSEDK_OP_MAX_TENSORS] = {0};
  int owned[FUSEDK_OP_MAX_TENSORS] = {0}, n_out = 0, status = -1;
  for (int pass = 0; pass < 2; ++pass) /* inputs first: outputs are made like one of them */
    for (int i = 0; i < o->n_tensors; ++i) {
      const fusedk_op_tensor *a = &o->tensors[i];
      if ((a->kind >= FUSEDK_ARG_OUT) != pass) continue;
      obj[i] = py.tuple_getitem(args, i);
      if (!obj[i]) goto out;
      if (obj[i] == py.none) {
        obj[i] = NULL;
        if (!pass || (a->kind == FUSEDK_ARG_OUT_OPT && !t[a->when])) continue;
        if (!obj[a->like]) goto out; /* a required input is missing: the generic path says which */
        void *argt = py.tuple_new(2);
        py.tuple_setitem(argt, 0, py.getattr(obj[a->like], "shape"));
        py.tuple_setitem(argt, 1, py.getattr(obj[a->like], "dtype"));
        obj[i] = py.call(type, argt, NULL);
        py.decref(argt);
        if (!obj[i]) {
          status = fusedk__fail(FUSEDK_ERR_OUT_OF_MEMORY, "%s: allocating %s through the framework failed", o->name,
                                a->name);
          goto out;
        }
        owned[i] = 1;
      } else if (py.isinstance(obj[i], type) != 1) {
        goto out;
      }
      if (attrs_view(obj[i], dtypes, &view[i], dims[i])) goto out;
      t[i] = &view[i];
      n_out += pass;
      /* a new output lands on the current device: when x is elsewhere, the generic path (which
         switches devices) takes the call */
      if (owned[i] && view[i].device.device_id != view[a->like].device.device_id) goto out;
    }
  {
    const double attrs[FUSEDK_OP_MAX_ATTRS] = {a0, a1, a2, a3};
    status = fusedk_op_call(op, t, attrs, (struct CUstream_st *)(intptr_t)stream);
  }
  if (status == FUSEDK_OK) return results(o, t, obj, NULL, NULL, owned, n_out);
out:
  py.err_clear();
  for (int i = 0; i < o->n_tensors; ++i)
    if (owned[i]) py.decref(obj[i]);
  return failed(status);
}

/* --- packed arrays ------------------------------------------------------------------------- */

/* One tensor slot as the bindings pack it: data, device type and id, ndim (-1: absent), dtype,
   then ndim sizes and ndim strides in BYTES (NumPy's and CuPy's own unit). */
typedef struct {
  int64_t data;
  int32_t device_type, device_id, ndim;
  uint8_t code, bits;
  uint16_t lanes;
} packed_head;

/* Runs registry op `op` on tensors packed one after another in `buf`. GIL-free (cffi). */
FUSEDK_DEF fusedk_status fusedk_op_call_packed(int32_t op, const void *buf, size_t len, double a0, double a1, double a2,
                                               double a3, struct CUstream_st *stream) {
  const fusedk_op *o = fusedk_op_get(op);
  if (!o) return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "op_call_packed: op %d is unknown", (int)op);
  fusedk_tensor view[FUSEDK_OP_MAX_TENSORS];
  const fusedk_tensor *t[FUSEDK_OP_MAX_TENSORS];
  int64_t st[FUSEDK_OP_MAX_TENSORS][FUSEDK_MAX_DIMS];
  const char *p = (const char *)buf, *end = p + len;
  for (int i = 0; i < o->n_tensors; ++i) {
    packed_head h;
    if (end - p < (ptrdiff_t)sizeof h) return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: packed arguments are short", o->name);
    memcpy(&h, p, sizeof h);
    p += sizeof h;
    t[i] = NULL;
    if (h.ndim < 0) continue;
    fusedk_tensor *v = &view[i];
    t[i] = v;
    v->data = (void *)(intptr_t)h.data;
    v->device.device_type = h.device_type, v->device.device_id = h.device_id;
    v->ndim = h.ndim;
    v->dtype.code = h.code, v->dtype.bits = h.bits, v->dtype.lanes = h.lanes;
    v->byte_offset = 0;
    if (h.ndim > FUSEDK_MAX_DIMS) { /* packed without sizes; the op's validation names it in order */
      v->shape = v->strides = NULL;
      continue;
    }
    if (end - p < (ptrdiff_t)(16 * h.ndim)) return fusedk__fail(FUSEDK_ERR_INVALID_ARGUMENT, "%s: packed arguments are short", o->name);
    v->shape = (int64_t *)(void *)p; /* 8-byte aligned: the bindings pack 24 + 8k bytes a slot */
    const int64_t item = h.bits / 8 * (h.lanes ? h.lanes : 1);
    for (int d = 0; d < h.ndim; ++d) {
      int64_t b;
      memcpy(&b, p + 8 * (h.ndim + d), 8);
      if (item <= 0 || b % item)
        return fusedk__fail(FUSEDK_ERR_LAYOUT, "%s: %s has a stride of %lld bytes in dim %d, not a multiple of its "
                            "%lld-byte elements", o->name, o->tensors[i].name, (long long)b, d, (long long)item);
      st[i][d] = b / item;
    }
    v->strides = st[i];
    p += 16 * h.ndim;
  }
  const double attrs[FUSEDK_OP_MAX_ATTRS] = {a0, a1, a2, a3};
  return fusedk_op_call(op, t, attrs, stream);
}
